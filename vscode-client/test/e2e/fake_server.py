"""A stand-in OptiML server that speaks the job and proposal protocol the extension is built to,
for drive.js: `optiml.compareProposal`, `optiml.openReport`, a cancellable `optiml.optimize` job,
`optiml.cancelJob`; `fake.seen` answers what it was sent."""

from typing import Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer

server = LanguageServer("optiml-fake", "9.9.9")
seen: dict[str, Any] = {}


@server.feature(types.INITIALIZE)
def initialize(ls: LanguageServer, params: types.InitializeParams) -> None:
    seen["experimental"] = params.capabilities.experimental
    seen["initializationOptions"] = params.initialization_options


@server.command("optiml.compareProposal")
def compare(ls: LanguageServer, arg: Any) -> dict[str, str]:
    seen["compareArg"] = arg
    return {
        "original": "file:///w/k.cu",
        "variant": "file:///tmp/optiml/p1/k.cu",
        "title": "k.cu: original ↔ proposal (2.3× faster)",
    }


@server.command("optiml.openReport")
def report(ls: LanguageServer, arg: Any) -> dict[str, str]:
    return {"report": "file:///tmp/optiml/p1/report.html"}


@server.command("optiml.optimize")
async def optimize(ls: LanguageServer, arg: Any) -> None:
    token = "job-1"
    await ls.work_done_progress.create_async(token)
    title = f"OptiML: optimize {arg['kernel']}"
    begin = types.WorkDoneProgressBegin(title=title, cancellable=True, percentage=0)
    ls.work_done_progress.begin(token, begin)
    report = types.WorkDoneProgressReport(message="8/64 evaluations", percentage=12)
    ls.work_done_progress.report(token, report)


@server.feature(types.WINDOW_WORK_DONE_PROGRESS_CANCEL)
def cancel(ls: LanguageServer, params: types.WorkDoneProgressCancelParams) -> None:
    seen["cancelledToken"] = params.token
    ls.work_done_progress.end(params.token, types.WorkDoneProgressEnd(message="cancelled"))


@server.command("optiml.cancelJob")
def cancel_all(ls: LanguageServer, *args: Any) -> None:
    seen["cancelJobArgs"] = list(args)


@server.command("fake.seen")
def report_seen(ls: LanguageServer, *args: Any) -> dict[str, Any]:
    return seen


if __name__ == "__main__":
    server.start_io()
