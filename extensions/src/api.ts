// Requests to the workbench server extension; every URL is built from the server settings,
// so the extension works under a non-root base URL (JupyterHub) and with Jupyter's auth.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export interface RankRow {
  rank: number;
  host: string | null;
  pid: number | null;
  device: string | null;
  state: string;
  exit: string;
  memory_mb: number | null;
  gpu: { device: number; memory_mb: number | null; util: number } | null;
  straggler: boolean;
  trainer: { run: string | null; state: string | null; step: number | null; loss: number | null };
}

export interface RankSet {
  id: string;
  kernel_id: string | null;
  kernel_pid: number;
  notebook: string | null;
  notebook_path: string | null;
  launcher: string;
  backend: string;
  world_size: number;
  state: string;
  stale: boolean;
  stopped_by: string | null;
  stream: boolean;
  job_id: string | null;
  detached?: boolean | null; // held by a keeper process past its kernel (%distrain detach)
  keeper_pid?: number | null;
  run?: { id: string; kind: string; state: string; text: string } | null; // the session's current run (notebook.runs)
  name?: string | null;
  queue: { job_id: string; state: string; reason: string; nodes: string[] } | null;
  step: number | null;
  loss: number | null;
  ranks: RankRow[];
}

const settings = ServerConnection.makeSettings();

export function apiUrl(...parts: string[]): string {
  return URLExt.join(settings.baseUrl, 'workbench', 'ranksets', ...parts.map(encodeURIComponent));
}

export async function request<T>(method: string, parts: string[], body?: unknown): Promise<T> {
  const init: RequestInit = { method };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
  }
  const response = await ServerConnection.makeRequest(apiUrl(...parts), init, settings);
  const text = await response.text();
  let data: any = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { message: text };
  }
  if (!response.ok) {
    throw new Error((data && (data.message || data.reason)) || `${response.status} ${response.statusText}`);
  }
  return data as T;
}

export function listRankSets(): Promise<{ ranksets: RankSet[] }> {
  return request('GET', []);
}

export function act(id: string, action: string, ranks?: number[]): Promise<any> {
  return request('POST', [id, action], ranks ? { ranks } : {});
}

export function forget(id: string): Promise<any> {
  return request('DELETE', [id]);
}

export function eventsSocket(id: string): WebSocket {
  let url = URLExt.join(settings.wsUrl, 'workbench', 'ranksets', encodeURIComponent(id), 'events');
  if (settings.token) {
    url += `?token=${encodeURIComponent(settings.token)}`;
  }
  return new WebSocket(url);
}
