"""End to end with the LLM policy, on a GPU machine, with no real LLM: a local server on 127.0.0.1
plays recorded answers (benchmarks/llm_e2e_saxpy.json: three edits of fixtures/saxpy.cu, a float4
version with a scalar tail and an alignment check, a grid-stride version given as a diff with a new
launch, and one that does not compile; and the judge's review), once in OpenAI's wire format and
once in Anthropic's.

For each provider:
  1. record: `optiml optimize FILE -k KERNEL --policy llm --provider P --base-url URL --model M
     --budget 6 --out OUT/P-record --json`, with a dummy API key and a response cache of its own;
  2. replay: the server stopped, the same with `--replay --out OUT/P-replay`: every answer must
     come from the cache.
Then it prints and writes OUT/summary.json: exit codes, the winners' speedups, the rejected edits,
and whether the replay proposed the same edits as the recording without a miss.

    python3 benchmarks/llm_e2e.py --out DIR [--providers openai,anthropic] [--budget 6]
    python3 benchmarks/llm_e2e.py --out DIR --dry-run

--dry-run needs no GPU: it starts each server, has the LLM policy ask it once for edits (the
recorded edits go through the policy's real checks, nvcc included) and the judge once, replays
both from the cache with the server stopped, and checks that the stopped server no longer answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESPONSES = Path(__file__).with_name("llm_e2e_saxpy.json")
MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-sonnet-4-5"}
# Not a real key: the local server checks none. Real keys are removed from the runs' environment,
# so none is ever sent to it.
DUMMY_KEY = "local-e2e-dummy-key"
KEY_VARIABLES = ("OPTIML_LLM_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY")


# ---- the recorded server -------------------------------------------------------------------------


class RecordedServer:
    """An OpenAI- or Anthropic-format server on 127.0.0.1 that answers each structured request with
    the recorded answer for its schema (`EditProposals` or `JudgeReview`)."""

    def __init__(self, provider: str, answers: dict[str, Any]):
        self.provider = provider
        self.answers = answers
        self.requests: list[str] = []  # the schema each request asked for
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._http.server_port

    @property
    def base_url(self) -> str:
        # OpenAI's base URL includes /v1; Anthropic's does not (its SDK adds /v1/messages).
        root = f"http://127.0.0.1:{self.port}"
        return root + "/v1" if self.provider == "openai" else root

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def schema_of(self, body: dict[str, Any]) -> str | None:
        if self.provider == "anthropic":
            choice = body.get("tool_choice") or {}
            if choice.get("name"):
                return choice["name"]
        else:
            fmt = body.get("response_format") or {}
            if fmt.get("type") == "json_schema":
                return fmt.get("json_schema", {}).get("name")
            for tool in body.get("tools") or []:
                return tool.get("function", {}).get("name")
        text = json.dumps(body.get("messages", []))
        return next((name for name in self.answers if name in text), None)

    def reply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        schema = self.schema_of(body)
        with self._lock:
            self.requests.append(schema or "?")
        if schema not in self.answers:
            message = f"no recorded answer for schema {schema!r}"
            if self.provider == "anthropic":
                return 400, {
                    "type": "error",
                    "error": {"type": "invalid_request_error", "message": message},
                }
            return 400, {"error": {"message": message, "type": "invalid_request_error"}}
        answer = self.answers[schema]
        text = json.dumps(answer)
        usage_in, usage_out = max(1, len(json.dumps(body)) // 4), max(1, len(text) // 4)
        if self.provider == "anthropic":
            return 200, {
                "id": f"msg_{len(self.requests)}",
                "type": "message",
                "role": "assistant",
                "model": body.get("model", "recorded"),
                "content": [{"type": "tool_use", "id": "toolu_1", "name": schema, "input": answer}],
                "stop_reason": "tool_use",
                "stop_sequence": None,
                "usage": {"input_tokens": usage_in, "output_tokens": usage_out},
            }
        return 200, {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "recorded"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": usage_in,
                "completion_tokens": usage_out,
                "total_tokens": usage_in + usage_out,
            },
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self
        path = "/v1/messages" if self.provider == "anthropic" else "/v1/chat/completions"

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                if self.path.split("?")[0] != path:
                    status, payload = 404, {"error": {"message": f"no route {self.path}"}}
                else:
                    status, payload = server.reply(body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def answers_from(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if k in ("EditProposals", "JudgeReview")}


def still_answers(url: str) -> bool:
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=b"{}", method="POST"), timeout=2)
    except urllib.error.HTTPError:
        return True  # it answered, if with an error
    except OSError:
        return False
    return True


# ---- the runs ------------------------------------------------------------------------------------


def optiml_command() -> list[str]:
    found = shutil.which("optiml")
    return [found] if found else [sys.executable, "-m", "optiml.cli"]


def run_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KEY_VARIABLES}
    env = {k: v for k, v in env.items() if not k.startswith("OPTIML_LLM_")}
    env["OPTIML_LLM_API_KEY"] = DUMMY_KEY
    env["OPTIML_LLM_CACHE_DIR"] = str(cache)
    return env


def optimize(
    args: argparse.Namespace, provider: str, base_url: str, out: Path, cache: Path, replay: bool
) -> dict[str, Any]:
    cmd = [
        *optiml_command(),
        "optimize",
        str(args.file),
        "-k",
        args.kernel,
        "--policy",
        "llm",
        "--provider",
        provider,
        "--base-url",
        base_url,
        "--model",
        MODELS[provider],
        "--budget",
        str(args.budget),
        "--out",
        str(out),
        "--json",
    ]
    if replay:
        cmd.append("--replay")
    print("$", " ".join(cmd), flush=True)
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=run_env(cache), timeout=args.timeout, cwd=ROOT
        )
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        code, stdout, stderr = 124, e.stdout or "", f"timed out after {args.timeout} s"
        stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
    seconds = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    (out / "stdout.json").write_text(stdout)
    (out / "stderr.txt").write_text(stderr if isinstance(stderr, str) else stderr.decode())
    try:
        payload = json.loads(stdout) if stdout.strip() else {}
    except ValueError:
        payload = {}
    return {"exit_code": code, "seconds": round(seconds, 1), **summarize(payload, stderr)}


def summarize(t: dict[str, Any], stderr: str) -> dict[str, Any]:
    """What one run's trajectory says: winner, speedup, the LLM's edits and the rejected ones."""
    if "nodes" not in t:
        tail = [line for line in str(stderr).strip().splitlines() if line.strip()][-3:]
        return {"error": t.get("error") or " | ".join(tail) or "no trajectory"}
    winner = t.get("winner")
    speedup = next((c["speedup"] for c in t.get("confirmed", []) if c["node"] == winner), None)
    edits = sorted(
        {
            (n["edit"]["summary"], n["edit"].get("digest"))
            for n in t["nodes"]
            if n.get("edit") and n["edit"].get("origin") == "llm"
        }
    )
    judge = t.get("judge") or {}
    return {
        "outcome": t.get("outcome"),
        "evaluations": t.get("evaluations"),
        "winner": winner,
        "winner_speedup": speedup,
        "winner_edits": path_to(t, winner),
        "judge_accepted": judge.get("accepted"),
        "llm_review": judge.get("llm"),
        "llm_cost_usd": t.get("llm_cost_usd"),
        "llm_edits": [{"summary": s, "digest": d} for s, d in edits],
        "rejected": [
            {k: r.get(k) for k in ("title", "stage", "reason")} for r in t.get("rejected", [])
        ],
    }


def path_to(t: dict[str, Any], node: int | None) -> list[str]:
    nodes = {n["id"]: n for n in t.get("nodes", [])}
    out = []
    while node is not None and node in nodes:
        n = nodes[node]
        if n.get("edit"):
            out.append(n["edit"]["summary"])
        node = n.get("parent")
    return out[::-1]


def replay_matched(record: dict[str, Any], replay: dict[str, Any]) -> bool:
    """The replay ran, proposed the recording's edits (or a subset: with other measurements the
    search may stop elsewhere) and missed no recorded answer, the judge's review included."""
    if record.get("exit_code") != 0 or replay.get("exit_code") != 0:
        return False
    recorded = {e["digest"] for e in record.get("llm_edits", [])}
    replayed = {e["digest"] for e in replay.get("llm_edits", [])}
    misses = [r for r in replay.get("rejected", []) if r["stage"] == "request"]
    review_missed = "error" in (replay.get("llm_review") or {})
    return bool(replayed) and replayed <= recorded and not misses and not review_missed


def full(args: argparse.Namespace) -> dict[str, Any]:
    answers = answers_from(args.responses)
    results: dict[str, Any] = {}
    for provider in args.providers:
        cache = args.out / f"{provider}-cache"
        shutil.rmtree(cache, ignore_errors=True)
        server = RecordedServer(provider, answers)
        try:
            record = optimize(
                args, provider, server.base_url, args.out / f"{provider}-record", cache, False
            )
        finally:
            server.stop()
        record["server_requests"] = list(server.requests)
        replay = optimize(
            args, provider, server.base_url, args.out / f"{provider}-replay", cache, True
        )
        results[provider] = {
            "record": record,
            "replay": replay,
            "replay_matched": replay_matched(record, replay),
            "same_winner_edits": record.get("winner_edits") == replay.get("winner_edits")
            if record.get("exit_code") == 0 and replay.get("exit_code") == 0
            else None,
        }
    return results


# ---- the dry run ---------------------------------------------------------------------------------


async def dry_provider(
    provider: str, answers: dict[str, Any], cache: Path, args: argparse.Namespace
) -> dict:
    from optiml.llm import LLMSettings, make_client
    from optiml.search.llm_policy import LLMPolicy, make_llm_review
    from optiml.search.policy import NodeView
    from optiml.search.trajectory import Measurement
    from optiml.search.variant import Variant

    file, kernel = args.file, args.kernel
    text = file.read_text()
    request = NodeView(variant=Variant(text), path=str(file), kernel=kernel)
    shutil.rmtree(cache, ignore_errors=True)
    env = {"OPTIML_LLM_API_KEY": DUMMY_KEY}
    server = RecordedServer(provider, answers)
    out: dict[str, Any] = {"port": server.port}

    def settings(replay: bool) -> LLMSettings:
        return LLMSettings(
            provider=provider,
            model=MODELS[provider],
            base_url=server.base_url,
            cache_dir=cache,
            replay=replay,
            timeout_s=30,
        )

    m = Measurement(status="ok", message="correct", speedup=1.2, candidate_ms=1.0, reference_ms=1.2)

    async def once(replay: bool) -> tuple[list, list, dict]:
        async with make_client(settings(replay), env={} if replay else env) as client:
            policy = LLMPolicy(client, arch=args.arch)
            found = await policy.propose(request, 3, random.Random(0))
            shown = found[0].variant if found else request.variant
            review = await make_llm_review(client, text, str(file), kernel)(shown, m)
        return found, policy.rejected, review

    try:
        found, rejected, review = await once(False)
    finally:
        server.stop()
    out["requests"] = list(server.requests)
    out["candidates"] = [c.edit.summary for c in found]
    out["rejected"] = [{k: r[k] for k in ("title", "stage", "reason")} for r in rejected]
    out["review"] = review
    out["stopped"] = not still_answers(server.base_url)
    replayed, _, replay_review = await once(True)
    out["replay_matched"] = [c.edit.key for c in replayed] == [c.edit.key for c in found] and (
        replay_review == review
    )
    out["ok"] = (
        out["requests"] == ["EditProposals", "JudgeReview"]
        and len(found) == 2
        and [r["stage"] for r in rejected] == ["compile"]
        and review["accept"] is True
        and out["stopped"]
        and out["replay_matched"]
    )
    return out


def dry(args: argparse.Namespace) -> dict[str, Any]:
    answers = answers_from(args.responses)
    return {
        p: asyncio.run(dry_provider(p, answers, args.out / f"dry-{p}-cache", args))
        for p in args.providers
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the runs and summary go")
    parser.add_argument("--file", type=Path, default=ROOT / "fixtures" / "saxpy.cu")
    parser.add_argument("--kernel", default="saxpy")
    parser.add_argument("--responses", type=Path, default=RESPONSES, help="recorded answers")
    parser.add_argument(
        "--providers",
        type=lambda s: [p.strip() for p in s.split(",") if p.strip()],
        default=["openai", "anthropic"],
    )
    parser.add_argument("--budget", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per optiml run")
    parser.add_argument("--arch", default="sm_90", help="nvcc target of --dry-run's checks")
    parser.add_argument(
        "--dry-run", action="store_true", help="servers, one policy request and one review, no GPU"
    )
    args = parser.parse_args(argv)
    unknown = [p for p in args.providers if p not in MODELS]
    if unknown:
        parser.error(f"unknown provider(s) {', '.join(unknown)}; use openai and/or anthropic")
    args.out.mkdir(parents=True, exist_ok=True)
    results = dry(args) if args.dry_run else full(args)
    summary = {
        "mode": "dry-run" if args.dry_run else "full",
        "file": str(args.file),
        "kernel": args.kernel,
        "budget": args.budget,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "providers": results,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    if args.dry_run:
        return 0 if all(r["ok"] for r in results.values()) else 1
    ok = all(r["record"]["exit_code"] == 0 and r["replay_matched"] for r in results.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
