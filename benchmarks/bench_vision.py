"""Image chats through HTTP on the Qwen2.5-VL-7B shape (random bf16 weights; issue 14).

    python benchmarks/bench_vision.py --out benchmarks/out/vision.json [--skip-hf]

Starts the four services (`helios run CORE --config YAML`: the engine with dummy weights)
on a weightless Qwen2.5-VL-7B core (config + the Qwen tokenizer + a Qwen-VL chat template)
and measures, with OpenAI-shaped streaming chats carrying one 1024x768 PNG each:

- the vision encoder alone (in process, before the stack starts: benchmarks/vision_encoder.py)
  on one 1024x768 image with each encoder attention backend (sdpa, triton), and which is
  faster (the engine setting `vision_attention`; `--vision-attention` runs the stack with it);
  `--vision-pixels values` runs the stack fetching pixel_values (bf16) instead of the raw
  uint8 pixels (engine setting `vision_pixels`, default raw), for a same-run comparison;
- TTFT of one image + a ~32-token question (median of a few, each with a new image), split
  into the engine's encoder / prefill milliseconds per request and the rest (gateway,
  frontend, imageprep, queueing), and the decode milliseconds per token after it;
- output tok/s at 16 and 64 concurrent image chats (one distinct image each, 256 tokens,
  ignore_eos);
- the same at 64 with every request sending one image (the engine's feature-cache hit);
- where the engine's time went over each level (the dashboard's completion records from
  GetLoad: vision encoder, prefill and decode step milliseconds; the encoder runs inside
  the prefill step that consumes its image, so prefill includes the vision share);
- transformers' `generate` on the same shape at 16 concurrent (one padded batch of 16
  distinct images, 256 new tokens) for the ratio.

About 2-3 minutes on one H200. Prints one line per level and writes the JSON with --out.
CPU smoke run of the same path: `--shape tiny --skip-hf --levels 2,4 --output-len 8`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks.model_shapes import write_core
from benchmarks.stacks import serve_stack
from services.common import assets

TEXT = {"vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "hidden_act": "silu", "rms_norm_eps": 1e-06, "max_position_embeddings": 128000,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                            "mrope_section": [16, 24, 24]},
        "use_sliding_window": False, "sliding_window": 32768, "max_window_layers": 28,
        "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
        "initializer_range": 0.02}
VISION = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
          "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
          "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
          "hidden_act": "silu", "tokens_per_second": 2, "in_chans": 3}
CONFIG = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
          "text_config": TEXT, "vision_config": VISION, "image_token_id": 151655,
          "video_token_id": 151656, "vision_start_token_id": 151652,
          "vision_end_token_id": 151653, "tie_word_embeddings": False,
          "torch_dtype": "bfloat16", "eos_token_id": 151645}
TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{%- if message.content is string %}{{ message.content }}{%- else %}"
    "{%- for part in message.content %}{%- if part.type == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{%- elif part.type == 'text' %}{{ part.text }}"
    "{%- endif %}{%- endfor %}{%- endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
QUESTION = ("Describe this picture in detail: the objects, their colours, where they are, "
            "what the light is like, and anything unusual you notice about it.")
STACK_YAML = """engine:
  load_format: dummy
  max_model_len: 8192
  max_num_seqs: 64
  prefill_chunk_size: 2048
  max_num_batched_tokens: 4096
  vision_cache_bytes: 2147483648
  vision_attention: {attention}
  vision_pixels: {pixels}
imageprep:
  memory_cache_bytes: 4294967296
gateway:
  max_active: 512
  queue_capacity: 1024
"""


# `--shape tiny`: the same path on a toy shape (a CPU smoke run of this script)
TINY = {**CONFIG, "text_config": {**TEXT, "hidden_size": 64, "intermediate_size": 128,
                                  "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "num_key_value_heads": 2,
                                  "rope_parameters": {**TEXT["rope_parameters"],
                                                      "mrope_section": [2, 3, 3]}},
        "vision_config": {**VISION, "depth": 2, "hidden_size": 32, "intermediate_size": 48,
                          "num_heads": 2, "out_hidden_size": 64,
                          "fullatt_block_indexes": [1]}}


def write_model(out: Path, config: dict = CONFIG) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645]}) + "\n")
    source = assets.fetch("qwen3")
    (out / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    tok_config = json.loads((source / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return out


def rgb_image(seed: int, width: int = 1024, height: int = 768) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # smooth gradients plus noise: compresses like a photo, decodes like one
    base = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    noise = rng.normal(0, 8, (height, width, 3)).astype(np.float32)
    return np.clip(base + noise + rng.integers(0, 64, 3), 0, 255).astype(np.uint8)


def png(seed: int, width: int = 1024, height: int = 768) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(rgb_image(seed, width, height)).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def jpeg(seed: int, width: int = 1024, height: int = 768) -> bytes:
    """The same picture as `png`, as a quality-90 JPEG (what a camera or a phone uploads)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(rgb_image(seed, width, height)).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def media_type(image: bytes) -> str:
    return "image/jpeg" if image.startswith(b"\xff\xd8\xff") else "image/png"


def chat_body(model: str, image: bytes, max_tokens: int) -> dict:
    url = f"data:{media_type(image)};base64," + base64.b64encode(image).decode()
    return {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": QUESTION}]}]}


async def one_chat(client, url: str, body: dict) -> tuple[float, float, int]:
    """(TTFT s, total s, completion tokens) of one streamed chat."""
    started = time.perf_counter()
    first = None
    tokens = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices") and \
                    chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - started
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    total = time.perf_counter() - started
    # a token whose text is empty (a byte of a UTF-8 sequence, a special token): the
    # stream's end stands in (with max_tokens 1, what TTFT measures)
    return (first if first is not None else total), total, tokens


class Breakdown:
    """Engine milliseconds per completion kind (vision, prefill, decode, ...) from the
    dashboard's completion records, polled every second while a level runs (the engine
    keeps records only while someone polls, and at most 1024 of them)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.cursor = 0
        self.totals: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> None:
        import grpc

        from services.common.pb import engine_pb2, engine_pb2_grpc

        with grpc.insecure_channel(self.address) as channel:
            load = engine_pb2_grpc.EngineStub(channel).GetLoad(
                engine_pb2.GetLoadRequest(completions_after=self.cursor), timeout=30)
        for record in load.completions:
            if record.sequence > self.cursor:
                self.totals[record.kind] = self.totals.get(record.kind, 0.0) + max(
                    0.0, record.gpu_ms)
                self.cursor = record.sequence

    def __enter__(self) -> Breakdown:
        self.poll()
        self.totals = {}

        def loop() -> None:
            while not self._stop.wait(1.0):
                self.poll()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self.poll()


async def level(url: str, model: str, images: list[bytes], max_tokens: int) -> dict:
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        started = time.perf_counter()
        results = await asyncio.gather(*(one_chat(client, url, chat_body(model, i, max_tokens))
                                         for i in images))
        wall = time.perf_counter() - started
    tokens = sum(r[2] for r in results)
    return {"concurrency": len(images), "wall_s": wall, "output_tokens": tokens,
            "output_tok_s": tokens / wall, "ttft_ms_p50": 1e3 * statistics.median(
                r[0] for r in results)}


def measure_stack(args: argparse.Namespace, root: Path) -> dict:
    import httpx

    config = root / "stack.yaml"
    config.write_text(STACK_YAML.format(attention=args.vision_attention,
                                        pixels=args.vision_pixels))
    shape = TINY if args.shape == "tiny" else CONFIG
    core = write_core(write_model(root / "model", shape), root / "core")
    report: dict = {}
    with serve_stack(core, config, root / "helios-run.log", args.startup_timeout) as run:
        url, engine = run.url, run.addresses["engine"]
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        asyncio.run(level(url, model, [png(999)], 8))               # warm-up
        with Breakdown(engine) as first_tokens:
            ttfts = [asyncio.run(level(url, model, [png(1000 + i)], 1))["ttft_ms_p50"]
                     for i in range(5)]
        report["ttft_ms"] = {"p50": statistics.median(ttfts), "all": ttfts}
        print(f"TTFT one 1024x768 image + question: {report['ttft_ms']['p50']:.1f} ms "
              "(p50 of 5)", flush=True)
        with Breakdown(engine) as decoding:
            asyncio.run(level(url, model, [png(1100)], DECODE_TOKENS + 1))
        report["ttft_split"] = ttft_split(statistics.mean(ttfts), first_tokens.totals,
                                          len(ttfts), decoding.totals)
        print(f"TTFT split (ms per request): {report['ttft_split']}", flush=True)
        counts = [int(c) for c in args.levels.split(",")]
        levels = [(f"c{c}", [png(2000 + 100 * c + i) for i in range(c)]) for c in counts]
        levels.append((f"c{counts[-1]}_same_image", [png(4000)] * counts[-1]))
        for name, images in levels:
            with Breakdown(engine) as breakdown:
                result = asyncio.run(level(url, model, images, args.output_len))
            result["engine_ms"] = breakdown.totals
            report[name] = result
            print(f"{name}: {result['output_tok_s']:.0f} output tok/s, TTFT p50 "
                  f"{result['ttft_ms_p50']:.0f} ms, engine ms by kind "
                  f"{ {k: round(v) for k, v in breakdown.totals.items()} }", flush=True)
    return report


DECODE_TOKENS = 16


def ttft_split(ttft_ms: float, engine_ms: dict[str, float], requests: int,
               decoding_ms: dict[str, float]) -> dict:
    """Mean TTFT as the engine's encoder and prefill milliseconds per request and the rest
    (host services, queueing; the prefill record may include an encoder pass the stage ran
    inside it), and decode milliseconds per generated token from a longer request."""
    encoder = engine_ms.get("vision", 0.0) / requests
    prefill = sum(v for k, v in engine_ms.items() if k in ("prefill", "mixed")) / requests
    return {"ttft_ms": ttft_ms, "encoder_ms": encoder, "prefill_ms": prefill,
            "other_ms": ttft_ms - encoder - prefill,
            "decode_ms_per_token": decoding_ms.get("decode", 0.0) / DECODE_TOKENS}


def measure_hf(root: Path, batch: int, output_len: int) -> dict:
    """transformers' generate, bf16 random weights, one batch of `batch` distinct images."""
    import torch
    import transformers
    from PIL import Image

    from services.imageprep.decode import DecodedImage
    from services.imageprep.expansion import expand_prompt
    from services.imageprep.processor import process_image
    from services.imageprep.profiles import builtin_profile

    model_dir = root / "model"
    config = transformers.AutoConfig.from_pretrained(model_dir)
    model_class = transformers.Qwen2_5_VLForConditionalGeneration
    with torch.device("cuda"):
        try:
            model = model_class._from_config(config, dtype=torch.bfloat16).eval()
        except TypeError:                                    # transformers < 5
            model = model_class._from_config(config, torch_dtype=torch.bfloat16).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": QUESTION}]}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    rows, pixels, grids, types = [], [], [], []
    for i in range(batch):
        rgb = np.asarray(Image.open(io.BytesIO(png(2000 + 100 * batch + i))).convert("RGB"))
        prepared = process_image(DecodedImage(rgb, "RGB", 1), builtin_profile("qwen2_5_vl"))
        expanded = expand_prompt(ids, [prepared.geometry], image_token_id=151655,
                                 vision_start_token_id=151652)
        rows.append(expanded.token_ids.tolist())
        types.append(expanded.modality_ids.tolist())
        pixels.append(torch.from_numpy(prepared.tensors["pixel_values"]))
        grids.append(torch.from_numpy(prepared.tensors["grid_thw"]))
    kwargs = {"input_ids": torch.tensor(rows, device="cuda"),
              "attention_mask": torch.ones(len(rows), len(rows[0]), dtype=torch.long,
                                           device="cuda"),
              "pixel_values": torch.cat(pixels).to("cuda", torch.bfloat16),
              "image_grid_thw": torch.cat(grids).to("cuda"),
              "mm_token_type_ids": torch.tensor(types, device="cuda")}
    with torch.no_grad():
        model.generate(**kwargs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        torch.cuda.synchronize()
        started = time.perf_counter()
        out = model.generate(**kwargs, max_new_tokens=output_len, min_new_tokens=output_len,
                             do_sample=False)
        torch.cuda.synchronize()
    wall = time.perf_counter() - started
    tokens = (out.shape[1] - len(rows[0])) * batch
    del model
    torch.cuda.empty_cache()
    return {"concurrency": batch, "wall_s": wall, "output_tokens": tokens,
            "output_tok_s": tokens / wall}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--shape", choices=("qwen2.5-vl-7b", "tiny"), default="qwen2.5-vl-7b",
                        help="tiny: a toy shape, for a CPU smoke run of the script")
    parser.add_argument("--levels", default="16,64", help="concurrent image chats")
    parser.add_argument("--vision-attention", choices=("sdpa", "triton"), default="sdpa",
                        help="the stack's encoder attention backend (engine vision_attention)")
    parser.add_argument("--vision-pixels", choices=("raw", "values"), default="raw",
                        help="how the engine fetches pixels (engine vision_pixels)")
    parser.add_argument("--skip-encoder", action="store_true",
                        help="skip the in-process encoder stage")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available() and args.shape != "tiny":
        print("no CUDA device: the 7B shape needs one; running the tiny CPU smoke instead",
              flush=True)
        args.shape, args.levels, args.output_len, args.skip_hf = "tiny", "2,4", 8, True
    encoder = None
    if not args.skip_encoder:
        from benchmarks.vision_encoder import encoder_stage

        device = "cuda" if torch.cuda.is_available() else "cpu"
        encoder = encoder_stage(TINY if args.shape == "tiny" else CONFIG, device)
        print(f"vision encoder, one {encoder['image']} image ({encoder['patches']} patches, "
              f"{encoder['dtype']}): ms by attention backend {encoder['ms']}, faster: "
              f"{encoder['faster']}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        report = measure_stack(args, root)
        if encoder is not None:
            report["encoder"] = encoder
        if not args.skip_hf:
            report["hf_c16"] = measure_hf(root, 16, args.output_len)
            report["ratio_c16"] = (report["c16"]["output_tok_s"] /
                                   report["hf_c16"]["output_tok_s"])
            print(f"HF generate c16: {report['hf_c16']['output_tok_s']:.0f} tok/s; Helios / HF "
                  f"= {report['ratio_c16']:.1f}x", flush=True)
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
