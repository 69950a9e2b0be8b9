// A live pane: loss per rank + mean, throughput, memory, collective time per op and the
// step-time breakdown of one rank set, drawn as plain SVG from events the server pushes
// over its websocket (history first), so it keeps moving while the kernel runs a cell.
import { Widget } from '@lumino/widgets';
import { eventsSocket, RankSet } from './api';
import { displayName, el } from './sidebar';

const PHASES = ['data', 'forward', 'backward', 'optimizer', 'comm_wait'];
const COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f', '#bcbd22', '#17becf'];
const MAX_DRAWN = 600;

type Line = { xs: number[]; ys: number[] };

class Chart {
  lines = new Map<string, Line>();
  means = new Map<number, { sum: number; n: number }>();
  node: HTMLElement;
  private svg: SVGSVGElement;
  private legend: HTMLElement;

  constructor(readonly key: string, title: string, private withMean = false) {
    this.node = el('div', 'wb-Chart');
    this.node.dataset.chart = key;
    this.node.appendChild(el('div', 'wb-Chart-title', title));
    this.svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
    this.svg.setAttribute('viewBox', '0 0 400 180');
    this.svg.setAttribute('preserveAspectRatio', 'none');
    this.node.appendChild(this.svg);
    this.legend = el('div', 'wb-Legend');
    this.node.appendChild(this.legend);
  }

  add(name: string, x: number, y: unknown): boolean {
    const v = typeof y === 'string' ? Number(y) : (y as number);
    if (v === null || v === undefined || !isFinite(v)) {
      return false;
    }
    let line = this.lines.get(name);
    if (!line) {
      line = { xs: [], ys: [] };
      this.lines.set(name, line);
    }
    line.xs.push(x);
    line.ys.push(v);
    if (this.withMean) {
      const m = this.means.get(x) || { sum: 0, n: 0 };
      m.sum += v;
      m.n += 1;
      this.means.set(x, m);
    }
    return true;
  }

  clear(): void {
    this.lines.clear();
    this.means.clear();
  }

  points(): number {
    let n = 0;
    this.lines.forEach(l => (n += l.xs.length));
    return n;
  }

  draw(): void {
    const all = new Map(this.lines);
    if (this.withMean && this.means.size) {
      const xs = [...this.means.keys()].sort((a, b) => a - b);
      all.set('mean', { xs, ys: xs.map(x => this.means.get(x)!.sum / this.means.get(x)!.n) });
    }
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    all.forEach(l => {
      for (let i = 0; i < l.xs.length; i++) {
        x0 = Math.min(x0, l.xs[i]); x1 = Math.max(x1, l.xs[i]);
        y0 = Math.min(y0, l.ys[i]); y1 = Math.max(y1, l.ys[i]);
      }
    });
    const svg = this.svg;
    while (svg.firstChild) {
      svg.removeChild(svg.firstChild);
    }
    this.legend.textContent = '';
    if (!isFinite(x0)) {
      this.legend.textContent = 'no data yet';
      return;
    }
    if (x1 === x0) { x1 = x0 + 1; }
    if (y1 === y0) { y1 = y0 + Math.abs(y0 || 1) * 0.01; }
    const sx = (x: number) => 40 + ((x - x0) / (x1 - x0)) * 355;
    const sy = (y: number) => 170 - ((y - y0) / (y1 - y0)) * 160;
    const text = (x: number, y: number, s: string) => {
      const t = document.createElementNS('http://www.w3.org/2000/svg', 'text');
      t.setAttribute('x', String(x)); t.setAttribute('y', String(y)); t.textContent = s;
      svg.appendChild(t);
    };
    text(0, 12, y1.toPrecision(3)); text(0, 172, y0.toPrecision(3));
    text(40, 180, String(x0)); text(360, 180, String(x1));
    let i = 0;
    all.forEach((l, name) => {
      const stride = Math.max(1, Math.ceil(l.xs.length / MAX_DRAWN));
      const pts: string[] = [];
      for (let k = 0; k < l.xs.length; k += stride) {
        pts.push(`${sx(l.xs[k]).toFixed(1)},${sy(l.ys[k]).toFixed(1)}`);
      }
      const last = l.xs.length - 1;
      if (last % stride) { pts.push(`${sx(l.xs[last]).toFixed(1)},${sy(l.ys[last]).toFixed(1)}`); }
      const color = name === 'mean' ? '#000' : COLORS[i++ % COLORS.length];
      const poly = document.createElementNS('http://www.w3.org/2000/svg', 'polyline');
      poly.setAttribute('points', pts.join(' '));
      poly.setAttribute('fill', 'none');
      poly.setAttribute('stroke', name === 'mean' ? 'var(--jp-ui-font-color0)' : color);
      poly.setAttribute('stroke-width', name === 'mean' ? '2' : '1.2');
      poly.dataset.line = name;
      svg.appendChild(poly);
      const item = el('span', '', `■ ${name} `);
      item.style.color = name === 'mean' ? 'var(--jp-ui-font-color0)' : color;
      this.legend.appendChild(item);
    });
  }
}

export class LivePane extends Widget {
  private charts: Chart[];
  private socket: WebSocket | null = null;
  private run: string | null = null;
  private pending = false;
  private status: HTMLElement;
  private received = 0;
  private retry: number | null = null;

  constructor(private rs: RankSet) {
    super();
    this.id = `workbench-pane-${rs.id}-${Math.random().toString(36).slice(2, 8)}`;
    this.addClass('wb-Pane');
    this.title.label = `Live: ${displayName(rs)}`;
    this.title.caption = `live training of ${rs.notebook || rs.id}`;
    this.title.closable = true;
    this.node.dataset.ranksetId = rs.id;
    this.status = el('div', 'wb-Pane-head', 'connecting…');
    this.node.appendChild(this.status);
    this.charts = [
      new Chart('loss', 'Loss per rank (and mean)', true),
      new Chart('throughput', 'Throughput (tokens/s per rank)'),
      new Chart('memory', 'Memory (MB per rank)'),
      new Chart('collective', 'Collective time per op and rank (s per step)'),
      new Chart('breakdown', 'Step time breakdown (s, rank 0)')
    ];
    const grid = el('div', 'wb-Charts');
    this.charts.forEach(c => grid.appendChild(c.node));
    this.node.appendChild(grid);
    this.connect();
  }

  private connect(): void {
    const socket = (this.socket = eventsSocket(this.rs.id));
    socket.onmessage = msg => {
      const data = JSON.parse(msg.data);
      if (data.type === 'history') {
        this.charts.forEach(c => c.clear());
        this.run = null;
        this.received = 0;
      }
      for (const e of data.events) {
        this.add(e);
      }
      this.schedule();
    };
    socket.onclose = () => {
      if (!this.isDisposed) {
        this.status.textContent = 'disconnected from the server; retrying…';
        this.retry = window.setTimeout(() => this.connect(), 2000);
      }
    };
  }

  private add(e: any): void {
    if (e.kind !== 'step') {
      return;
    }
    if (e.run !== this.run) {
      this.run = e.run;
      this.charts.forEach(c => c.clear());
    }
    this.received += 1;
    const m = e.metrics || {};
    const rank = `rank ${e.rank}`;
    const [loss, tput, mem, coll, brk] = this.charts;
    loss.add(rank, e.step, m.loss_local ?? m.loss);
    tput.add(rank, e.step, m.tps ?? m.samples_per_s);
    const bytes = m.memory_active_bytes ?? m.memory_rss_bytes;
    mem.add(rank, e.step, bytes === undefined || bytes === null ? null : Number(bytes) / 2 ** 20);
    for (const [op, fields] of Object.entries(e.comm || {})) {
      coll.add(`${op} ${rank}`, e.step, (fields as any).time_s);
    }
    if (e.rank === 0) {
      for (const p of PHASES) {
        brk.add(p, e.step, m[`time_${p}_s`]);
      }
    }
  }

  private schedule(): void {
    if (this.pending) {
      return;
    }
    this.pending = true;
    window.setTimeout(() => {
      this.pending = false;
      if (this.isDisposed) {
        return;
      }
      this.charts.forEach(c => c.draw());
      const points = this.charts[0].points();
      this.node.dataset.points = String(points);
      this.status.textContent = `run ${this.run ?? '–'} · ${this.received} step events · ${points} loss points`;
    }, 250);
  }

  dispose(): void {
    if (this.retry !== null) {
      window.clearTimeout(this.retry);
    }
    const socket = this.socket;
    super.dispose();
    socket?.close();
  }
}
