// One poller of the rank-set list shared by the sidebar and the status bar.
import { Signal } from '@lumino/signaling';
import { listRankSets, RankSet } from './api';

export class RankSetsModel {
  ranksets: RankSet[] = [];
  error = '';
  readonly changed = new Signal<this, void>(this);
  private timer: number | null = null;
  private busy = false;

  constructor(private period = 1000) {}

  start(): void {
    if (this.timer === null) {
      void this.refresh();
      this.timer = window.setInterval(() => void this.refresh(), this.period);
    }
  }

  dispose(): void {
    if (this.timer !== null) {
      window.clearInterval(this.timer);
      this.timer = null;
    }
  }

  async refresh(): Promise<void> {
    if (this.busy) {
      return;
    }
    this.busy = true;
    try {
      this.ranksets = (await listRankSets()).ranksets;
      this.error = '';
    } catch (err) {
      this.error = `cannot reach the workbench server extension: ${(err as Error).message}`;
    } finally {
      this.busy = false;
    }
    this.changed.emit();
  }
}
