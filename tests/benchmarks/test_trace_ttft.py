"""benchmarks/trace_ttft.py's timeline: marks from several processes' files grouped per request
(from each client send), repeated marks numbered, the warm-up skipped, medians in time order;
marks after the first chunk and marks most requests lack are left out."""

from __future__ import annotations

from benchmarks.trace_ttft import timeline


def test_marks_are_grouped_per_request_and_reported_as_medians(tmp_path):
    client, core = [], []
    for i, start in enumerate((100.0, 200.0, 300.0, 400.0)):
        slow = 0.004 if i == 3 else 0.002
        client += [f"{start:.6f} client.send", f"{start + 0.010 + slow:.6f} client.first_chunk"]
        core += [f"{start + 0.001:.6f} core.sent", f"{start + 0.005:.6f} core.sent",
                 f"{start + 0.020:.6f} core.sent"]               # after the first chunk
        if i == 2:
            core.append(f"{start + 0.003:.6f} core.rare")
    (tmp_path / "client.txt").write_text("\n".join(client) + "\n")
    (tmp_path / "core-1.txt").write_text("\n".join(core) + "\n")
    rows = timeline(tmp_path, skip=1)
    assert [(name, round(ms, 3), n) for name, ms, n in rows] == [
        ("client.send #1", 0.0, 3), ("core.sent #1", 1.0, 3), ("core.sent #2", 5.0, 3),
        ("client.first_chunk #1", 12.0, 3)]


def test_chat_bodies_are_streaming_chats_of_the_asked_length():
    import argparse

    from benchmarks.trace_ttft import _chat_bodies

    bodies = _chat_bodies(argparse.Namespace(model="m", input_len=40, requests=3))
    assert len(bodies) == 3
    for path, body in bodies:
        assert path == "/v1/chat/completions" and body["stream"] and body["model"] == "m"
        [message] = body["messages"]
        assert message["role"] == "user" and len(message["content"].split()) == 40
    assert len({body["messages"][0]["content"] for _, body in bodies}) == 3   # distinct
