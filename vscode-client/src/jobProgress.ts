/** The server's jobs as cancellable notifications. The language client shows all work-done
 * progress in the status bar, where VS Code offers no cancel button; a progress that the server
 * begins as `cancellable` (an optimize, profile or generate job) is shown here instead, as a
 * notification whose Cancel sends `window/workDoneProgress/cancel` for its token. Compiles (which
 * the server begins as not cancellable: a newer save ends one) stay in the status bar. No `vscode` import: `extension.ts` supplies the view. */

export type ProgressToken = number | string;

export interface WorkDoneProgressValue {
  kind: 'begin' | 'report' | 'end';
  title?: string;
  message?: string;
  percentage?: number;
  cancellable?: boolean;
}

export interface ProgressView {
  /** `increment`: percentage points since the last report, as `vscode.Progress` wants them. */
  report(message: string | undefined, increment: number | undefined): void;
  done(): void;
}

/** Shows a cancellable progress titled `title`; `onCancel` runs when the user cancels it. */
export type ShowProgress = (title: string, onCancel: () => void) => ProgressView;

interface Job {
  view: ProgressView;
  reported: number;
  title: string;
}

export class JobProgress {
  private readonly jobs = new Map<ProgressToken, Job>();

  constructor(
    private readonly show: ShowProgress,
    private readonly cancel: (token: ProgressToken) => void,
    private readonly changed: () => void = () => {},
  ) {}

  /** The language client's `middleware.handleWorkDoneProgress`. `next` is the client's own
   * handling; it gets every value but a job's `begin` (it then has nothing shown to update, and
   * still forgets the token at `end`). */
  handle(token: ProgressToken, value: WorkDoneProgressValue, next: () => void): void {
    if (value.kind === 'begin' && value.cancellable === true) {
      const title = value.title ?? 'OptiML job';
      const view = this.show(title, () => this.cancel(token));
      const job: Job = { view, reported: 0, title };
      this.jobs.set(token, job);
      this.update(job, value);
      this.changed();
      return;
    }
    const job = this.jobs.get(token);
    if (job !== undefined) {
      if (value.kind === 'report') {
        this.update(job, value);
      } else if (value.kind === 'end') {
        this.jobs.delete(token);
        job.view.done();
        this.changed();
      }
    }
    next();
  }

  /** The titles of the jobs running now. */
  get running(): string[] {
    return [...this.jobs.values()].map((job) => job.title);
  }

  /** The server stopped: its jobs are gone. */
  clear(): void {
    const jobs = [...this.jobs.values()];
    this.jobs.clear();
    for (const job of jobs) {
      job.view.done();
    }
    if (jobs.length > 0) {
      this.changed();
    }
  }

  private update(job: Job, value: WorkDoneProgressValue): void {
    let increment: number | undefined;
    if (typeof value.percentage === 'number' && Number.isFinite(value.percentage)) {
      const percentage = Math.max(0, Math.min(100, value.percentage));
      increment = Math.max(0, percentage - job.reported);
      job.reported += increment;
    }
    if (value.message !== undefined || (increment !== undefined && increment > 0)) {
      job.view.report(value.message, increment);
    }
  }
}
