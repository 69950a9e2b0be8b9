// The ranks sidebar: every rank set of this user's kernels, a row per rank, confirmed actions.
// Past GROUP_PAST ranks a set's ranks are grouped by host with counts by state (see rankgroups).
import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';
import { act, forget, RankRow, RankSet } from './api';
import { RankSetsModel } from './model';
import { filtered, GROUP_PAST, groupRanks, groupSummary, stateCounts, STRAGGLING, VirtualRows } from './rankgroups';

const ACTIONS: { action: string; label: string; confirm: string; danger?: boolean }[] = [
  { action: 'interrupt', label: 'Interrupt', confirm: 'Interrupt the cell running on every rank (SIGINT)?' },
  { action: 'where', label: 'Where', confirm: "Dump every rank's Python stack (nothing is stopped)?" },
  { action: 'trainer-pause', label: 'Pause', confirm: "Pause the ranks' trainer?" },
  { action: 'trainer-resume', label: 'Resume', confirm: "Resume the ranks' trainer?" },
  { action: 'trainer-stop', label: 'Stop trainer', confirm: "Stop the ranks' trainer?" },
  { action: 'stop', label: 'Stop ranks', confirm: 'End every rank process of this set? Their state is lost.', danger: true }
];

function fmt(value: number | null | undefined, digits = 3): string {
  return value === null || value === undefined ? '' : Number(value).toPrecision(digits);
}

export interface SidebarCallbacks {
  openPane(rs: RankSet): void;
  openNotebook(path: string): void;
}

export class RanksSidebar extends Widget {
  private message = '';
  // grouped sets: `${set id}\n${host}` -> which rows the open group lists ('' every rank, or a
  // state); absent: closed. Kept across redraws, as are the open lists' scroll positions.
  private open = new Map<string, string>();
  private scrolls = new Map<string, number>();
  private lists: VirtualRows[] = [];

  constructor(private model: RankSetsModel, private callbacks: SidebarCallbacks) {
    super();
    this.id = 'workbench-ranks';
    this.addClass('wb-Ranks');
    this.title.caption = 'Workbench ranks';
    this.title.label = 'Ranks';
    model.changed.connect(() => this.render());
    this.render();
  }

  private render(): void {
    const node = this.node;
    for (const list of this.lists) {
      list.save();
    }
    node.textContent = '';
    this.lists = [];
    const head = document.createElement('h2');
    head.textContent = 'Workbench ranks';
    node.appendChild(head);
    if (this.model.error) {
      node.appendChild(el('div', 'wb-Message', this.model.error));
    }
    if (!this.model.ranksets.length) {
      node.appendChild(el('div', 'wb-Empty', 'No rank sets. Start one in a notebook: %distrain start -n 2'));
    }
    for (const rs of this.model.ranksets) {
      node.appendChild(this.renderSet(rs));
    }
    if (this.message) {
      node.appendChild(el('div', 'wb-Message', this.message));
    }
    for (const list of this.lists) {
      list.restore();
    }
  }

  private renderSet(rs: RankSet): HTMLElement {
    const box = el('div', 'wb-RankSet');
    box.dataset.ranksetId = rs.id;
    box.dataset.state = rs.state;
    const title = el('div', 'wb-RankSet-title', displayName(rs));
    title.title = rs.notebook || '';
    if (rs.detached) {
      box.dataset.detached = 'true';
      const badge = el('span', 'wb-Badge wb-Badge-detached', 'detached');
      badge.title = `held by keeper pid ${rs.keeper_pid}: %distrain attach --session ${rs.name} takes it back`;
      title.appendChild(badge);
    }
    box.appendChild(title);
    let meta = `${rs.world_size} ranks · ${rs.launcher} · ${rs.backend} · ${rs.state}`;
    if (rs.step !== null) {
      meta += ` · step ${rs.step} · loss ${fmt(rs.loss, 4)}`;
    }
    if (rs.queue) {
      meta += `: ${queueText(rs)}`;
    }
    if (rs.stopped_by) {
      meta += ` (${rs.stopped_by})`;
    }
    if (rs.stale) {
      meta += ' (its kernel is gone: cleaned from the registry)';
    }
    box.appendChild(el('div', 'wb-RankSet-meta', meta));
    if (rs.run) {
      // the state its kind last told (a trainer run's live state is in the rank rows below)
      const told = rs.run.state && rs.run.state !== 'starting' ? `: ${rs.run.state}` : '';
      const run = el('div', 'wb-RankSet-run', `${rs.run.kind} run ${rs.run.id}${told}`);
      run.title = rs.run.text;
      box.appendChild(run);
    }
    const actions = el('div', 'wb-Actions');
    if (rs.state === 'running') {
      for (const spec of ACTIONS) {
        const button = el('button', spec.danger ? 'wb-danger' : '', spec.label) as HTMLButtonElement;
        button.dataset.action = spec.action;
        button.onclick = () => void this.run(rs, spec.action, spec.label, spec.confirm);
        actions.appendChild(button);
      }
      if (rs.stream) {
        const pane = el('button', '', 'Live pane') as HTMLButtonElement;
        pane.dataset.action = 'pane';
        pane.onclick = () => this.callbacks.openPane(rs);
        actions.appendChild(pane);
      }
    } else if (rs.state !== 'queued' && rs.state !== 'starting') {
      const button = el('button', '', 'Forget') as HTMLButtonElement;
      button.dataset.action = 'forget';
      button.onclick = () => void forget(rs.id).then(() => this.model.refresh(), showError);
      actions.appendChild(button);
    }
    if (rs.notebook_path) {
      const open = el('button', '', 'Open notebook') as HTMLButtonElement;
      open.dataset.action = 'open';
      open.onclick = () => this.callbacks.openNotebook(rs.notebook_path!);
      actions.appendChild(open);
    }
    box.appendChild(actions);
    const gpu = rs.ranks.some(r => r.gpu);
    if (rs.ranks.length > GROUP_PAST) {
      box.appendChild(this.renderGroups(rs, gpu));
      return box;
    }
    const table = el('table', 'wb-RankTable');
    const header = el('tr', '');
    for (const h of ['rank', 'state', 'host', 'pid', 'device', 'MB', ...(gpu ? ['GPU MB', 'GPU %'] : []), 'step', 'loss']) {
      header.appendChild(el('th', '', h));
    }
    table.appendChild(header);
    for (const r of rs.ranks) {
      table.appendChild(rankRow(r, gpu, 'tr', 'td', true));
    }
    box.appendChild(table);
    return box;
  }

  /** A large set: a line of counts, then a collapsible group per host (its rows virtualised). */
  private renderGroups(rs: RankSet, gpu: boolean): HTMLElement {
    const wrap = el('div', 'wb-RankGroups');
    const groups = groupRanks(rs.ranks);
    const counts = stateCounts(rs.ranks).map(([s, n]) => `${n} ${s}`).join(', ');
    const lagging = rs.ranks.filter(r => r.straggler).length;
    wrap.appendChild(el('div', 'wb-RankSet-counts',
      `${rs.ranks.length} ranks on ${groups.length} hosts: ${counts}${lagging ? `; ${lagging} ${STRAGGLING}` : ''}`));
    for (const g of groups) {
      const key = `${rs.id}\n${g.host}`;
      const filter = this.open.get(key); // undefined: closed
      const group = el('div', 'wb-RankGroup');
      group.dataset.host = g.host;
      group.dataset.open = String(filter !== undefined);
      const head = el('div', 'wb-RankGroup-head');
      head.dataset.summary = groupSummary(g);
      const toggle = el('button', 'wb-RankGroup-toggle', `${filter === undefined ? '▸' : '▾'} host ${g.host}: ${g.ranks.length} ranks`);
      toggle.title = filter === undefined ? 'show its ranks' : 'hide its ranks';
      toggle.onclick = () => {
        if (filter === undefined) {
          this.open.set(key, '');
        } else {
          this.open.delete(key);
        }
        this.render();
      };
      head.appendChild(toggle);
      const chips: [string, string, string][] = g.counts.map(([state, n]) => [', ', state, `${n} ${state}`]);
      if (g.stragglers) {
        chips.push(['; ', STRAGGLING, `${g.stragglers} ${STRAGGLING}`]);
      }
      for (const [sep, state, text] of chips) {
        head.appendChild(document.createTextNode(sep));
        // a count lists only those ranks (again: every rank of the host)
        const chip = el('button', `wb-RankGroup-state wb-state-${state}`, text);
        chip.dataset.stateFilter = state;
        chip.classList.toggle('wb-selected', filter === state);
        chip.onclick = () => {
          this.open.set(key, filter === state ? '' : state);
          this.render();
        };
        head.appendChild(chip);
      }
      group.appendChild(head);
      if (filter !== undefined) {
        const rows = filtered(g, filter);
        const where = `${key}\n${filter}`;
        const list = new VirtualRows(
          rows,
          r => rankRow(r, gpu, 'div', 'span', false),
          this.scrolls.get(where) ?? 0,
          top => this.scrolls.set(where, top)
        );
        group.dataset.shown = String(rows.length);
        const body = el('div', 'wb-RankGroup-body'); // scrolls sideways in a narrow sidebar
        body.appendChild(rankHead(gpu));
        body.appendChild(list.node);
        group.appendChild(body);
        this.lists.push(list);
      }
      wrap.appendChild(group);
    }
    return wrap;
  }

  private async run(rs: RankSet, action: string, label: string, question: string): Promise<void> {
    const answer = await showDialog({
      title: `${label}: ${displayName(rs)}`,
      body: question,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label, displayType: action === 'stop' ? 'warn' : 'default' })]
    });
    if (!answer.button.accept) {
      return;
    }
    try {
      const result = await act(rs.id, action);
      if (action === 'where') {
        const body = document.createElement('div');
        // the conclusion first: who waits in which collective, and for whom
        if (result.culprit) {
          const lead = document.createElement('div');
          lead.className = 'wb-Culprit';
          lead.textContent = result.culprit as string;
          body.appendChild(lead);
        }
        const pre = document.createElement('div');
        pre.className = 'wb-Stacks';
        pre.textContent = Object.entries(result.stacks as Record<string, { where: string; frames: string[] }>)
          .map(([rank, s]) => [`[rank ${rank}] ${s.where}`, ...s.frames.slice(1).map(f => `    ${f}`)].join('\n'))
          .join('\n');
        body.appendChild(pre);
        void showDialog({ title: 'Where every rank is', body: new Widget({ node: body }), buttons: [Dialog.okButton()] });
      }
      this.message = `${label}: done`;
    } catch (err) {
      this.message = `${label}: ${(err as Error).message}`;
      showError(err);
    }
    await this.model.refresh();
  }
}

/** A rank's row: a table row (`tr`/`td`, with its host) or a grid row of a host's group (`div`/`span`). */
function rankRow(r: RankRow, gpu: boolean, rowTag: string, cellTag: string, withHost: boolean): HTMLElement {
  const row = el(rowTag, 'wb-RankRow');
  row.dataset.rank = String(r.rank);
  row.dataset.pid = r.pid === null ? '' : String(r.pid);
  row.dataset.state = r.state;
  const state = r.state + (r.exit ? ` (${r.exit})` : '') + (r.trainer.state ? ` · ${r.trainer.state}` : '');
  const gpuCells = gpu ? [fmt(r.gpu?.memory_mb, 4), r.gpu ? String(r.gpu.util) : ''] : [];
  const cells = [String(r.rank), state, ...(withHost ? [r.host ?? ''] : []), r.pid === null ? '' : String(r.pid),
    r.device ?? '', fmt(r.memory_mb, 4), ...gpuCells,
    r.trainer.step === null ? '' : String(r.trainer.step), fmt(r.trainer.loss, 4)];
  const stepColumn = cells.length - 2;
  cells.forEach((text, i) => {
    const td = el(cellTag, i === 1 ? `wb-state wb-state-${r.state}` : '', text);
    if (i === stepColumn && r.straggler) {
      td.classList.add('wb-straggler');
      td.title = 'straggler: this rank lags the others';
      td.textContent = `${text} ⚠`;
    }
    if (i === 1) {
      td.title = state;
    }
    row.appendChild(td);
  });
  if (!withHost) {
    row.style.gridTemplateColumns = gridColumns(gpu);
  }
  return row;
}

function gridColumns(gpu: boolean): string {
  return `3em minmax(5em, 1fr) 4.5em 3.5em 3.5em ${gpu ? '4em 3em ' : ''}3.5em 4em`;
}

function rankHead(gpu: boolean): HTMLElement {
  const head = el('div', 'wb-RankHead');
  for (const h of ['rank', 'state', 'pid', 'device', 'MB', ...(gpu ? ['GPU MB', 'GPU %'] : []), 'step', 'loss']) {
    head.appendChild(el('span', '', h));
  }
  head.style.gridTemplateColumns = gridColumns(gpu);
  return head;
}

/** `Slurm job 812 PENDING (Resources)` for a rank set whose job waits for its allocation. */
export function queueText(rs: RankSet): string {
  const q = rs.queue;
  if (!q) {
    return '';
  }
  const where = q.nodes && q.nodes.length ? ` on ${q.nodes.join(', ')}` : '';
  return `Slurm job ${q.job_id} ${q.state}${q.reason && q.reason !== 'None' ? ` (${q.reason})` : ''}${where}`;
}

export function displayName(rs: RankSet): string {
  if (rs.detached && rs.name) {
    return rs.name; // its kernel is gone: the set's name is what `%distrain attach --session NAME` takes
  }
  const path = rs.notebook_path || rs.notebook;
  return path ? path.split('/').pop()! : `kernel ${rs.kernel_pid}`;
}

function showError(err: unknown): void {
  void showErrorMessage('Workbench', (err as Error).message || String(err));
}

export function el(tag: string, cls: string, text?: string): HTMLElement {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}
