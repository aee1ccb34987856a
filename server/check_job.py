"""The compile job, run as `python -m server.check_job` so that a stale one dies with its nvcc: it
reads {"text", "path", "arch"} as JSON on stdin, checks the text as if it were the file at `path`
(nothing is written there) and writes the outcome as JSON on stdout."""

from __future__ import annotations

import json
import sys

from optiml.api import CheckResult, check_source
from optiml.cuda.source import SourceFile
from optiml.errors import OptimlError, ToolMissing


def outcome(result: CheckResult) -> dict:
    build = result.kernels[0].build if result.kernels else None
    return {
        "arch": result.arch,
        "ok": not result.compile_failed,
        "messages": [m.model_dump() for m in build.messages] if build else [],
        "kernels": {
            c.kernel.name: {
                "report": c.report.model_dump(mode="json") if c.report else None,
                "skipped": c.skipped,
            }
            for c in result.kernels
        },
    }


def main() -> int:
    request = json.load(sys.stdin)
    source = SourceFile(request["text"], request["path"])
    try:
        # a header with no kernels has nothing to compile on its own
        out = (
            outcome(check_source(source, arch=request["arch"]))
            if source.kernels
            else {"arch": request["arch"], "ok": True, "messages": [], "kernels": {}}
        )
    except ToolMissing as e:
        out = {"error": {"kind": "tool_missing", "message": str(e)}}
    except OptimlError as e:
        out = {"error": {"kind": "input", "message": str(e)}}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
