"""Where a request's time to first token goes across the services: a `helios run` stack with
stage marks in every process (benchmarks/ttft_trace/sitecustomize.py), one request at a time
through HTTP `/v1/completions` (token ids, streaming), and the median time of each mark from
the client's send.

    python benchmarks/trace_ttft.py                      # the CPU demo stack
    python benchmarks/trace_ttft.py --serve /cores/qwen3-8b --config stack.yaml
    python benchmarks/trace_ttft.py --vision tiny        # image chats, a tiny Qwen2.5-VL
    python benchmarks/trace_ttft.py --chat               # text chats instead of token ids

Marks (each process's wall clock, one host): the frontend's Generate entered, its engine call,
each engine message it reads; the engine servicer's Generate and each core message its pipe
reader dispatches; the core's step completions and pipe writes; the client's body encoded and
written, the gateway's request (headers) and its whole body received; the client's first SSE
chunk.
`--requests` requests of `--input-len` random ids and 2 output tokens; the first `--skip` are
warm-up. Prints the timeline; writes trace_ttft.json under --out.

`--vision SHAPE` (tiny, or qwen2.5-vl-7b on a GPU): streaming chats through
`/v1/chat/completions`, each with a new `--image` PNG (or `--image-format jpeg`: the same
picture as a quality-90 JPEG; benchmarks/bench_vision.py's model,
stack and images) and bench_vision's question, on a dummy-weight Qwen2.5-VL core; the marks
add the frontend's imageprep call, imageprep's Prepare and FetchPixels, and the core's
prefetch, pixel wait and encoder.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRACE_SITE = ROOT / "benchmarks" / "ttft_trace"


async def _send(url: str, bodies: list[tuple[str, dict]], client_log: Path) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=120) as client:
        for path, body in bodies:
            marks = [f"{time.time():.6f} client.send"]
            data = json.dumps(body).encode()
            marks.append(f"{time.time():.6f} client.encoded")

            async def content(data: bytes = data, marks: list[str] = marks):
                yield data          # resumed once the transport has written it
                marks.append(f"{time.time():.6f} client.body_written")
            headers = {"content-type": "application/json", "content-length": str(len(data))}
            async with client.stream("POST", url + path, content=content(),
                                     headers=headers) as response:
                first = True
                async for line in response.aiter_lines():
                    if first and _has_text(line):
                        marks.append(f"{time.time():.6f} client.first_chunk")
                        first = False
            with client_log.open("a") as log:
                log.write("\n".join(marks) + "\n")
            await asyncio.sleep(0.05)


def _has_text(line: str) -> bool:
    """An SSE line that carries generated text (a chat stream's role-only opening chunk does
    not), or the stream's end (a first token that decodes to no text)."""
    if line == "data: [DONE]":
        return True
    if not line.startswith("data: "):
        return False
    choices = json.loads(line[6:]).get("choices") or [{}]
    return bool(choices[0].get("text") or (choices[0].get("delta") or {}).get("content"))


def timeline(trace_dir: Path, skip: int) -> list[tuple[str, float, int]]:
    """(mark, median ms after the client's send, requests that had it), in time order."""
    events = []
    for path in trace_dir.glob("*.txt"):
        for line in path.read_text().splitlines():
            stamp, label = line.split(maxsplit=1)
            events.append((float(stamp), label))
    events.sort()
    requests: list[list[tuple[float, str]]] = []
    for stamp, label in events:
        if label == "client.send":
            requests.append([])
        if requests:
            requests[-1].append((stamp, label))
    offsets: dict[str, list[float]] = defaultdict(list)
    for request in requests[skip:]:
        start = request[0][0]
        seen: dict[str, int] = defaultdict(int)
        for stamp, label in request:
            seen[label] += 1
            offsets[f"{label} #{seen[label]}"].append((stamp - start) * 1e3)
            if label == "client.first_chunk":
                break
    measured = len(requests[skip:])
    rows = [(name, statistics.median(values), len(values)) for name, values in offsets.items()
            if 2 * len(values) > measured]     # marks most requests have
    return sorted(rows, key=lambda row: row[1])


def _vision_bodies(args: argparse.Namespace, tmp: Path) -> list[tuple[str, dict]]:
    """bench_vision's Qwen2.5-VL core and stack (args.serve and args.config set to them) and
    one chat per request, each with a new --image-format picture of --image WxH (its model
    named once served)."""
    from benchmarks import bench_vision
    from benchmarks.model_shapes import write_core

    shape = bench_vision.TINY if args.vision == "tiny" else bench_vision.CONFIG
    args.serve = write_core(bench_vision.write_model(tmp / "model", shape), tmp / "core")
    if args.config is None:
        args.config = tmp / "stack.yaml"
        args.config.write_text(bench_vision.STACK_YAML.format(attention="sdpa",
                                                              pixels=args.vision_pixels))
    width, height = (int(v) for v in args.image.split("x"))
    bodies = []
    for i in range(args.requests):
        encode = bench_vision.jpeg if args.image_format == "jpeg" else bench_vision.png
        body = bench_vision.chat_body("", encode(1000 + i, width, height), 2)
        body.pop("stream_options")
        bodies.append(("/v1/chat/completions", body))
    return bodies


def _chat_bodies(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """One streaming chat per request: a user message of --input-len random common words
    (about as many tokens), 2 output tokens. Against completions with token ids it shows
    what a chat's prompt costs more: the template, and the prefill's stop at the message
    boundary (a checkpoint target: scheduler/checkpoints.py)."""
    rng = random.Random(0)
    words = """time year people way day man thing woman life child world school state family
        student group country problem hand part place case week company system program question
        work government number night point home water room mother area money story fact month
        lot right study book eye job"""
    vocabulary = words.split()
    return [("/v1/chat/completions", {
        "model": args.model, "max_tokens": 2, "temperature": 0.0, "stream": True,
        "messages": [{"role": "user", "content": " ".join(
            rng.choice(vocabulary) for _ in range(args.input_len))}]})
        for _ in range(args.requests)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=Path, help="core or model directory (default: demo)")
    parser.add_argument("--config", type=Path, help="YAML config for --serve")
    parser.add_argument("--model", default="helios-demo", help="served model name")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--skip", type=int, default=5)
    parser.add_argument("--vocab-limit", type=int, default=150000)
    parser.add_argument("--vision", choices=("tiny", "qwen2.5-vl-7b"),
                        help="image chats on a dummy-weight Qwen2.5-VL core of this shape")
    parser.add_argument("--image", default="1024x768", help="--vision: each image's WxH")
    parser.add_argument("--image-format", choices=("png", "jpeg"), default="png",
                        help="--vision: a 1.6 MB noisy PNG (the default, the slow decode) or "
                             "the same picture as a quality-90 JPEG")
    parser.add_argument("--vision-pixels", choices=("raw", "values"), default="raw",
                        help="--vision: how the engine fetches pixels (vision_pixels)")
    parser.add_argument("--chat", action="store_true",
                        help="text chats (one user message of about --input-len words) "
                             "instead of completions with token ids")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")))
    args = parser.parse_args()
    from tests.support.processes import HeliosRun, free_port

    with tempfile.TemporaryDirectory() as tmp:
        if args.vision:
            bodies = _vision_bodies(args, Path(tmp))
        elif args.chat:
            bodies = _chat_bodies(args)
        else:
            rng = random.Random(0)
            bodies = [("/v1/completions", {
                "model": args.model, "max_tokens": 2, "ignore_eos": True, "temperature": 0.0,
                "stream": True,
                "prompt": [rng.randrange(args.vocab_limit) for _ in range(args.input_len)]})
                for _ in range(args.requests)]
        trace_dir = Path(tmp) / "trace"
        trace_dir.mkdir()
        runtime = Path(tmp) / "run"
        runtime.mkdir()
        env = dict(os.environ, HELIOS_TTFT_TRACE_DIR=str(trace_dir),
                   PYTHONPATH=os.pathsep.join(filter(None, (
                       str(TRACE_SITE), str(ROOT), os.environ.get("PYTHONPATH")))))
        command = ["--demo"] if args.serve is None else [str(args.serve)]
        if args.config:
            command += ["--config", str(args.config)]
        run = HeliosRun(command, Path(tmp) / "helios-run.log", runtime, free_port(), env)
        with contextlib.ExitStack() as stack:
            stack.callback(run.stop)
            run.wait_output("Helios is serving", timeout=900)
            if args.vision:         # the core's served name
                import httpx

                model = httpx.get(run.url + "/v1/models", timeout=30).json()["data"][0]["id"]
                for _, body in bodies:
                    body["model"] = model
            asyncio.run(_send(run.url, bodies, trace_dir / "client.txt"))
        rows = timeline(trace_dir, args.skip)
    print(f"{'ms after send':>14}  mark (requests)")
    for name, ms, count in rows:
        print(f"{ms:14.2f}  {name} ({count})")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "trace_ttft.json").write_text(json.dumps(
        [{"mark": name, "median_ms": ms, "requests": count} for name, ms, count in rows],
        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
