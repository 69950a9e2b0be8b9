// The distrain workbench's JupyterLab extension: ranks sidebar, live panes, status bar item
// and a command-palette entry that starts ranks in the current notebook.
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';
import { RankSet } from './api';
import { RankSetsModel } from './model';
import { LivePane } from './pane';
import { queueText, RanksSidebar } from './sidebar';

const INSERT = 'workbench:insert-start';
const SIDEBAR = 'workbench:open-ranks';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'distrain-workbench-lab:plugin',
  description: 'Ranks sidebar, live panes and status bar of the distrain workbench.',
  autoStart: true,
  optional: [ICommandPalette, INotebookTracker, IStatusBar, ILabShell],
  activate: (app: JupyterFrontEnd, palette: ICommandPalette | null, notebooks: INotebookTracker | null,
    statusBar: IStatusBar | null, labShell: ILabShell | null) => {
    const model = new RankSetsModel(1000);
    const openPane = (rs: RankSet) => {
      const pane = new LivePane(rs);
      app.shell.add(pane, 'main', { mode: 'split-right' });
      app.shell.activateById(pane.id);
    };
    const sidebar = new RanksSidebar(model, {
      openPane,
      openNotebook: path => void app.commands.execute('docmanager:open', { path })
    });
    // JupyterLab: a tab of the left sidebar. Notebook 7 (no ILabShell): its right side panel,
    // which only the property inspector and debugger share; shown with the command below.
    app.shell.add(sidebar, labShell ? 'left' : 'right', { rank: 950 });
    model.start();

    app.commands.addCommand(SIDEBAR, {
      label: 'Workbench: show the ranks sidebar',
      execute: () => app.shell.activateById(sidebar.id)
    });
    app.commands.addCommand(INSERT, {
      label: 'Workbench: insert a cell that starts 2 ranks (%distrain start -n 2)',
      isEnabled: () => !!notebooks?.currentWidget,
      execute: () => {
        const panel = notebooks?.currentWidget;
        if (!panel) {
          return;
        }
        NotebookActions.insertAbove(panel.content);
        panel.content.activeCell?.model.sharedModel.setSource('%load_ext workbench\n%distrain start -n 2');
      }
    });
    if (palette) {
      palette.addItem({ command: INSERT, category: 'Workbench' });
      palette.addItem({ command: SIDEBAR, category: 'Workbench' });
    }

    {
      const item = new Widget();
      item.addClass('wb-StatusItem');
      item.node.title = 'workbench ranks of this notebook';
      const update = () => {
        const kernelId = notebooks?.currentWidget?.sessionContext.session?.kernel?.id;
        const running = model.ranksets.filter(r => ['running', 'queued', 'starting'].includes(r.state));
        const rs = running.find(r => r.kernel_id && r.kernel_id === kernelId);
        item.node.textContent = rs ? statusText(rs) : '';
        item.node.dataset.ranksetId = rs ? rs.id : '';
      };
      model.changed.connect(update);
      notebooks?.currentChanged.connect(update);
      if (statusBar) {
        statusBar.registerStatusItem('distrain-workbench-lab:status', {
          item,
          align: 'left',
          rank: 4,
          isActive: () => true
        });
      } else {
        // Notebook 7 has no status bar: the item sits in its header beside the kernel's name,
        // and a click opens the ranks panel
        item.addClass('wb-StatusItem-top');
        item.node.onclick = () => app.shell.activateById(sidebar.id);
        app.shell.add(item, 'top', { rank: 1000 });
      }
    }
  }
};

export function statusText(rs: RankSet): string {
  let text = `${rs.world_size} ranks`;
  if (rs.queue) {
    return `${text} · ${rs.state}: ${queueText(rs)}`;
  }
  if (rs.step !== null) {
    text += ` · step ${rs.step}`;
  }
  if (rs.loss !== null) {
    text += ` · loss ${rs.loss.toFixed(2)}`;
  }
  const dead = rs.ranks.filter(r => r.state === 'dead').length;
  if (dead) {
    text += ` · ${dead} dead`;
  }
  return text;
}

export default plugin;
