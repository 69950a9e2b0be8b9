// Rank sets past GROUP_PAST ranks: ranks grouped by host with counts by state, each group
// collapsible, and an open group's rows in a virtualised list (only the rows in view are in the
// DOM), so a 1024-rank set costs the sidebar a few dozen elements, not 1024 table rows a second.
import { RankRow } from './api';

export const GROUP_PAST = 16; // larger sets are grouped; smaller ones keep their flat table
export const ROW_HEIGHT = 20; // px, fixed: a row's place is its index times this
const VIEW_ROWS = 14; // an open group shows at most this many rows at a time
const OVERSCAN = 4; // rows drawn beyond each edge of the view, so a scroll does not flash blanks

// states of a rank that works as it should; the others are counted by name
const OK_STATES = new Set(['idle', 'busy', 'running', 'remote', 'unknown']);

export interface RankGroup {
  host: string;
  ranks: RankRow[];
  counts: [string, number][]; // "ok" first, then the other states, most first
  stragglers: number; // ranks marked lagging the others (any state)
}

export const STRAGGLING = 'straggling'; // the filter that lists a group's stragglers

export function stateClass(state: string): string {
  return OK_STATES.has(state) ? 'ok' : state;
}

/** Ranks by host, hosts in the order of their first rank. */
export function groupRanks(ranks: RankRow[]): RankGroup[] {
  const byHost = new Map<string, RankRow[]>();
  for (const r of ranks) {
    const host = r.host ?? '(no host yet)';
    let list = byHost.get(host);
    if (!list) {
      list = [];
      byHost.set(host, list);
    }
    list.push(r);
  }
  return [...byHost.entries()].map(([host, rows]) => ({
    host,
    ranks: rows,
    counts: stateCounts(rows),
    stragglers: rows.filter(r => r.straggler).length
  }));
}

export function stateCounts(rows: RankRow[]): [string, number][] {
  const counts = new Map<string, number>();
  for (const r of rows) {
    const s = stateClass(r.state);
    counts.set(s, (counts.get(s) ?? 0) + 1);
  }
  return [...counts.entries()].sort((a, b) => (a[0] === 'ok' ? -1 : b[0] === 'ok' ? 1 : b[1] - a[1]));
}

/** `host a: 512 ranks, 511 ok, 1 dead` (`; 2 straggling` where some lag) */
export function groupSummary(g: RankGroup): string {
  const lag = g.stragglers ? `; ${g.stragglers} ${STRAGGLING}` : '';
  return `host ${g.host}: ${g.ranks.length} ranks, ${g.counts.map(([s, n]) => `${n} ${s}`).join(', ')}${lag}`;
}

/** The rows a group lists under ``filter``: '' every rank, a state, or its stragglers. */
export function filtered(g: RankGroup, filter: string): RankRow[] {
  if (!filter) {
    return g.ranks;
  }
  return filter === STRAGGLING ? g.ranks.filter(r => r.straggler) : g.ranks.filter(r => stateClass(r.state) === filter);
}

/** The rows of one open group, only those in view in the DOM; `render(row)` makes a row element. */
export class VirtualRows {
  readonly node: HTMLElement;
  private spacer: HTMLElement;
  private drawn = ''; // the window last drawn, so a scroll within it draws nothing

  constructor(
    private rows: RankRow[],
    private renderRow: (r: RankRow) => HTMLElement,
    private scrollTop: number,
    private onScroll: (top: number) => void
  ) {
    this.node = document.createElement('div');
    this.node.className = 'wb-RankRows';
    this.node.style.height = `${Math.min(rows.length, VIEW_ROWS) * ROW_HEIGHT}px`;
    this.spacer = document.createElement('div');
    this.spacer.className = 'wb-RankRows-spacer';
    this.spacer.style.height = `${rows.length * ROW_HEIGHT}px`;
    this.node.appendChild(this.spacer);
    this.node.addEventListener('scroll', () => {
      if (!this.node.isConnected) {
        return; // a scroll event that arrives after a redraw replaced this list: its position is saved
      }
      this.scrollTop = this.node.scrollTop;
      this.onScroll(this.scrollTop);
      this.draw();
    });
    this.draw();
  }

  /** Before a redraw replaces the list: keep its position (a scroll whose event has not fired yet included). */
  save(): void {
    if (this.node.isConnected) {
      this.scrollTop = this.node.scrollTop;
      this.onScroll(this.scrollTop);
    }
  }

  /** After the list is in the page: put its scroll position back (a redraw rebuilt it). */
  restore(): void {
    if (this.scrollTop) {
      this.node.scrollTop = this.scrollTop;
    }
  }

  private draw(): void {
    const first = Math.max(0, Math.floor(this.scrollTop / ROW_HEIGHT) - OVERSCAN);
    const last = Math.min(this.rows.length, first + VIEW_ROWS + 2 * OVERSCAN);
    const key = `${first}:${last}`;
    if (key === this.drawn) {
      return;
    }
    this.drawn = key;
    this.spacer.textContent = '';
    for (let i = first; i < last; i++) {
      const row = this.renderRow(this.rows[i]);
      row.style.top = `${i * ROW_HEIGHT}px`;
      this.spacer.appendChild(row);
    }
  }
}
