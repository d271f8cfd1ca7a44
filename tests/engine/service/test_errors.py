"""Typed errors over gRPC: admission failures keep their kind, stage, hint, counts and param."""

from __future__ import annotations

import grpc

from services.common.errors import (
    CapacityError,
    ContextOverflowError,
    ErrorStage,
    UnavailableError,
    UnsupportedError,
    ValidationError,
)
from services.common.pb import common_pb2, engine_pb2
from tests.engine.service.conftest import generate_request, typed_error


def _generate(engine, request):
    return lambda: list(engine.stub.Generate(request, timeout=60))


def test_validation_errors_name_the_field(engine):
    cases = [
        (generate_request("e1", []), "prompt_token_ids", "empty"),
        (generate_request("e2", [10**7]), "prompt_token_ids", "vocabulary"),
        (generate_request("e3", [1, 2], sampling=dict(top_p=2.0)), "sampling.top_p", "top_p"),
        (generate_request("e4", [1, 2], sampling=dict(stop_token_ids=[10**7])),
         "sampling.stop_token_ids", "vocabulary"),
        (generate_request("e5", [1, 2, 3], checkpoint_token_ends=[5]),
         "checkpoint_token_ends", "inside the prompt"),
        (generate_request("e6", [1, 2], n=0), "n", "n must"),
    ]
    for request, param, text in cases:
        code, error = typed_error(_generate(engine, request))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (param, code)
        assert isinstance(error, ValidationError) and error.param == param, error
        assert error.stage is ErrorStage.ADMISSION and text in error.message
        assert error.service == "engine"


def test_images_are_unsupported_by_a_text_model(engine):
    image = common_pb2.ImageDescriptor(identity=bytes(32), token_offset=1, num_tokens=4)
    request = generate_request("img", [1, 2, 3, 4, 5, 6], 2,
                               multimodal=common_pb2.MultimodalInputs(images=[image]))
    code, error = typed_error(_generate(engine, request))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(error, UnsupportedError) and error.param == "multimodal"
    bad = common_pb2.ImageDescriptor(identity=b"short", token_offset=1)
    code, error = typed_error(_generate(engine, generate_request(
        "img2", [1, 2, 3], 2, multimodal=common_pb2.MultimodalInputs(images=[bad]))))
    assert isinstance(error, ValidationError) and "identity" in error.param


def test_context_overflow_carries_counts_and_hint(engine):
    code, error = typed_error(_generate(engine, generate_request("ctx", [5] * 4000, 200)))
    assert code == grpc.StatusCode.OUT_OF_RANGE
    assert isinstance(error, ContextOverflowError)
    assert (error.prompt_tokens, error.max_tokens, error.context_length) == (4000, 200, 4096)
    assert "4096" in error.hint or "context" in error.hint


def test_capacity_errors_carry_the_hint(tmp_path, demo_core):
    from tests.engine.service.conftest import start_engine

    # 40 pages of 16 tokens; a request that could never fit is refused at admission
    with start_engine(tmp_path, "--kv-cache-bytes", str(40 * 8192 + 16 * (8192 + 256)),
                      "--num-snapshots", "16", "--max-num-seqs", "2", "--max-waiting", "1",
                      name="small") as engine:
        info = engine.stub.GetModelInfo(engine_pb2.GetModelInfoRequest())
        assert info.num_pages == 40 and info.max_model_len == 4096
        code, error = typed_error(_generate(engine, generate_request("big", [5] * 300, 400)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT   # it can never run: no retry
        assert isinstance(error, ValidationError) and "pages" in error.message
        assert error.hint == info.capacity_hint and error.hint
        # the waiting queue holds one request: two long ones run, one waits, the next fails
        calls = []
        for i in range(3):
            calls.append(engine.stub.Generate(generate_request(f"q{i}", [5] * 10, 500),
                                              timeout=300))
            next(calls[-1])
        assert engine.load().num_waiting >= 1       # q2 (and q1 if preempted for pages)
        code, error = typed_error(_generate(engine, generate_request("over", [5] * 10, 5)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and isinstance(error, CapacityError)
        assert error.retry_after_s == 1.0 and "queue" in error.message
        for call in calls:
            call.cancel()
        engine.wait_idle()
        load = engine.load()
        assert load.requests_rejected == 2


def test_pause_and_resume_admission(engine):
    state = engine.stub.PauseAdmission(engine_pb2.PauseAdmissionRequest())
    try:
        assert state.paused and not state.draining
        code, error = typed_error(_generate(engine, generate_request("paused", [1, 2], 2)))
        assert code == grpc.StatusCode.UNAVAILABLE and isinstance(error, UnavailableError)
        assert error.retry_after_s is not None
        assert engine.load().admission_paused
    finally:
        state = engine.stub.ResumeAdmission(engine_pb2.ResumeAdmissionRequest())
    assert not state.paused
    messages = list(engine.stub.Generate(generate_request("resumed", [1, 2], 2), timeout=60))
    assert messages[-1].outputs[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
