"""``hsextract prepare`` against the trainers' own released preprocessing, on the same tokenizer.

For each chat template family the tiny models get (ChatML/Qwen, Llama-3, DeepSeek-V3, Kimi-K2), each
paired with its SpecForge registry template: SpecForge 0.2.0's ``preprocess_conversations`` and
speculators 0.9.0's ``_preprocess_batch`` (``_normalize_conversation`` + ``_render_boundary_rows``,
its ``render_conversation`` answered by the same tokenizer's ``apply_chat_template`` in place of
vLLM's render endpoint) give exactly the ``input_ids`` and ``loss_mask`` prepare writes: multi-turn,
with and without a system prompt, unicode, out-of-order turns, and cut at ``--max-seq-len``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import datasets
import pytest
import speculators.data_generation.preprocessing as spec_pre
from specforge.data.preprocessing import preprocess_conversations
from specforge.data.template import TEMPLATE_REGISTRY
from transformers import AutoTokenizer

from hsextract.dev.sample_data import make_sample_conversations
from hsextract.dev.tokenizer import write_tokenizer
from hsextract.prepare.config import PrepareConfig
from hsextract.prepare.conversation import conversation_of
from hsextract.prepare.registry import TEMPLATES, UNSUPPORTED, matching_templates
from hsextract.prepare.rows import ALL_TURNS
from hsextract.prepare.run import run_prepare
from hsextract.prepare.specforge import SpecForgeConvention
from hsextract.prepare.speculators import SpeculatorsConvention

warnings.filterwarnings("ignore")

VOCAB = 1024
#: family -> (its SpecForge registry template, the registry templates its chat template fits)
FAMILIES = {
    "chatml": ("qwen", ["qwen", "lfm", "qwen3-thinking", "qwen3-instruct"]),
    "llama3": ("llama3", ["llama3"]),
    "deepseek_v3": ("deepseek-v3", ["deepseek-v3", "deepseek-v32"]),
    "kimi_k2": ("kimi-k2-instruct", ["kimi-k2-thinking", "kimi-k2-instruct"]),
}
LENGTHS = [4096, 60]  # no cut, and a cut inside conversations of every family

CONVERSATIONS: list[dict[str, Any]] = [
    {"conversations": [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": "4."}]},
    {
        "conversations": [
            {"from": "system", "value": "You answer in one line."},
            {"from": "human", "value": "Name a colour."},
            {"from": "gpt", "value": "Blue."},
            {"from": "human", "value": "Another one?"},
            {"from": "gpt", "value": "Green, then red."},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Grüße aus München! 你好, 世界 🙂"},
            {"role": "assistant", "content": "Привет! こんにちは — naïve café ∑π≈3.14 🚀"},
            {"role": "user", "content": "مرحبا"},
            {"role": "assistant", "content": "안녕하세요"},
        ]
    },
    {
        "messages": [
            {"role": "system", "content": "Réponds en français."},
            {"role": "user", "content": "  padded question  "},
            {"role": "assistant", "content": "  padded answer \n"},
        ]
    },
    {  # two assistant turns in a row: SpecForge cuts the conversation there, speculators keeps both
        "messages": [
            {"role": "user", "content": "Tell me two things."},
            {"role": "assistant", "content": "First thing."},
            {"role": "assistant", "content": "Second thing."},
            {"role": "user", "content": "Thanks."},
            {"role": "assistant", "content": "You are welcome."},
        ]
    },
    {  # a leading assistant turn and a trailing user turn
        "messages": [
            {"role": "assistant", "content": "Hello, how can I help?"},
            {"role": "user", "content": "Say yes."},
            {"role": "assistant", "content": "Yes."},
            {"role": "user", "content": "And now?"},
        ]
    },
    {
        "conversations": [
            {"from": "human", "value": " ".join(f"word{i}" for i in range(30))},
            {"from": "gpt", "value": " ".join(f"answer{i} ✓" for i in range(40))},
            {"from": "human", "value": "more"},
            {"from": "gpt", "value": "done"},
        ]
    },
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    out = {}
    for family in FAMILIES:
        path = write_tokenizer(tmp_path_factory.mktemp(f"tok-{family}"), family, VOCAB)
        out[family] = (path, AutoTokenizer.from_pretrained(str(path)))
    return out


def _render_locally(tokenizer: Any) -> Any:
    """speculators' render_conversation, answered by the tokenizer's apply_chat_template (vLLM renders the same way)."""

    def render_conversation(endpoint: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool,
                            tools: list[dict[str, Any]] | None = None, truncate_prompt_tokens: int | None = None,
                            **_: Any) -> list[int]:
        ids = tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=add_generation_prompt, tools=tools, return_dict=False
        )
        return list(ids)[:truncate_prompt_tokens]

    return render_conversation


def _theirs_specforge(tokenizer: Any, template: str, conv: dict[str, Any], max_len: int) -> list[tuple[list[int], list[int]]]:
    turns = conv.get("conversations") or conv["messages"]
    result = preprocess_conversations(tokenizer, [turns], TEMPLATE_REGISTRY.get(template), max_length=max_len)
    rows = [(ids[0].tolist(), mask[0].tolist()) for ids, mask in zip(result["input_ids"], result["loss_mask"], strict=True)]
    return [row for row in rows if any(row[1])]  # prepare drops a row with no supervised token


def _theirs_speculators(tokenizer: Any, conv: dict[str, Any], max_len: int,
                        monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], list[int]]]:
    monkeypatch.setattr(spec_pre, "render_conversation", _render_locally(tokenizer))
    turns = conv.get("conversations") or conv["messages"]
    result = spec_pre._preprocess_batch({"conversations": [turns]}, False, "http://render.invalid", max_len)
    return [(ids.tolist(), mask.tolist()) for ids, mask in zip(result["input_ids"], result["loss_mask"], strict=True)]


def _ours(convention: Any) -> list[list[tuple[list[int], list[int]]]]:
    outcomes = convention.prepare([conversation_of(i, conv) for i, conv in enumerate(CONVERSATIONS)])
    return [[(row.input_ids, row.loss_mask) for row in outcome.rows] for outcome in outcomes]


def test_registry_table_is_specforges() -> None:
    """Our table of SpecForge's registry: the same entries, field by field; the rest named as unsupported."""
    assert set(TEMPLATES) | set(UNSUPPORTED) == set(TEMPLATE_REGISTRY.get_all_template_names())
    for name, ours in TEMPLATES.items():
        theirs = TEMPLATE_REGISTRY.get(name)
        assert (ours.assistant_header, ours.user_header, ours.end_of_turn, ours.system_prompt) == (
            theirs.assistant_header, theirs.user_header, theirs.end_of_turn_token, theirs.system_prompt), name
        assert (ours.parser_type, list(ours.ignore_tokens) or None) == (theirs.parser_type, theirs.ignore_token), name
        assert ours.enable_thinking == theirs.enable_thinking and theirs.assistant_pattern_type == "general", name


@pytest.mark.parametrize("family", FAMILIES)
def test_template_matching(family: str, tokenizers: dict[str, tuple[Path, Any]]) -> None:
    template, fitting = FAMILIES[family]
    assert matching_templates(tokenizers[family][1]) == fitting
    assert template in fitting


@pytest.mark.parametrize("max_len", LENGTHS)
@pytest.mark.parametrize("family", FAMILIES)
def test_specforge_parity(family: str, max_len: int, tokenizers: dict[str, tuple[Path, Any]]) -> None:
    tokenizer = tokenizers[family][1]
    template = FAMILIES[family][0]
    ours = _ours(SpecForgeConvention(tokenizer, TEMPLATES[template], max_len))
    for index, conv in enumerate(CONVERSATIONS):
        assert ours[index] == _theirs_specforge(tokenizer, template, conv, max_len), (family, index)
    assert any(len(rows[0][0]) == max_len for rows in ours if rows) == (max_len < 4096)  # the cut was exercised


@pytest.mark.parametrize("max_len", LENGTHS)
@pytest.mark.parametrize("family", FAMILIES)
def test_speculators_parity(family: str, max_len: int, tokenizers: dict[str, tuple[Path, Any]],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = tokenizers[family][1]
    ours = _ours(SpeculatorsConvention(tokenizer, max_len))
    for index, conv in enumerate(CONVERSATIONS):
        assert ours[index] == _theirs_speculators(tokenizer, conv, max_len, monkeypatch), (family, index)
    if max_len < 4096:
        assert any(len(ids) == max_len for rows in ours for ids, _ in rows)  # the cut was exercised
    else:
        assert sum(len(rows) for rows in ours) > len(CONVERSATIONS)  # one row per assistant turn


@pytest.mark.parametrize("like", ["specforge", "speculators"])
@pytest.mark.parametrize("family", FAMILIES)
def test_prepared_dataset_parity(family: str, like: str, tokenizers: dict[str, tuple[Path, Any]], tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: generated conversations through ``run_prepare``; the written rows equal the trainer's."""
    path, tokenizer = tokenizers[family]
    source = make_sample_conversations(tmp_path / "conv.jsonl", 24, seed=7, style="sharegpt")
    config = PrepareConfig(model=path, dataset=source, output=tmp_path / "out", like=like, max_seq_len=160,
                           specforge_template=FAMILIES[family][0] if like == "specforge" else None, chunk_rows=10,
                           progress=False)
    run_prepare(config)
    written = datasets.load_from_disk(str(tmp_path / "out"))
    got: dict[int, list[tuple[list[int], list[int]]]] = {}
    for row in written:
        got.setdefault(row["source_row"], []).append((row["input_ids"], row["loss_mask"]))
        assert (row["turn"] == ALL_TURNS) == (like == "specforge")
    for index, line in enumerate(source.read_text(encoding="utf-8").splitlines()):
        conv = json.loads(line)
        if like == "specforge":
            theirs = _theirs_specforge(tokenizer, FAMILIES[family][0], conv, 160)
        else:
            theirs = _theirs_speculators(tokenizer, conv, 160, monkeypatch)
        assert got.get(index, []) == theirs, (family, like, index)
    counts = json.loads((tmp_path / "out" / "prepare.json").read_text())["counts"]
    assert counts["rows_out"] == len(written) and counts["truncated"] > 0


#: what the template itself writes when the data has no system prompt (speculators sees it; SpecForge inserts its own)
TEMPLATE_DEFAULT_SYSTEM = {"chatml": "You are Qwen", "llama3": None, "deepseek_v3": None, "kimi_k2": "You are Kimi"}


@pytest.mark.parametrize("family", FAMILIES)
def test_how_the_conventions_differ(family: str, tokenizers: dict[str, tuple[Path, Any]]) -> None:
    """Pinned: with the data's own system prompt the tokens agree, SpecForge's one row carries every turn's mask
    that speculators spreads over one row per turn; without one, each trainer's system prompt differs."""
    tokenizer = tokenizers[family][1]
    template = TEMPLATES[FAMILIES[family][0]]
    specforge = _ours(SpecForgeConvention(tokenizer, template, 4096))
    speculators = _ours(SpeculatorsConvention(tokenizer, 4096))
    (sf_ids, sf_mask), = specforge[1]  # conversation 1: a system prompt, two exchanges
    assert len(speculators[1]) == 2 and speculators[1][-1][0] == sf_ids
    union = [max(m[i] if i < len(m) else 0 for _, m in speculators[1]) for i in range(len(sf_ids))]
    assert sf_mask == union
    (sf_ids, _), = specforge[0]  # conversation 0: no system prompt
    (spec_ids, _), = speculators[0]
    sf_text, spec_text = tokenizer.decode(sf_ids), tokenizer.decode(spec_ids)
    assert sf_ids != spec_ids and template.system_prompt and template.system_prompt in sf_text
    default = TEMPLATE_DEFAULT_SYSTEM[family]
    if default is None:  # the template writes no system prompt of its own: speculators' row has none
        assert template.system_prompt not in spec_text and len(spec_ids) < len(sf_ids)
    else:  # speculators' row has the template's default, SpecForge's the registry's in its place
        assert default in spec_text and default not in sf_text


SCAFFOLD = (  # the generation prompt opens a think block that the recorded turn does not have (DeepSeek-R1's shape)
    "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)
COUNTING = (  # history depends on the turns after it: not prefix-stable
    "{{ '<|im_start|>system\\n' ~ (messages | length) ~ '<|im_end|>\\n' }}"
    "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.mark.parametrize("template", [SCAFFOLD, COUNTING], ids=["scaffold", "counting"])
def test_speculators_boundary_fallbacks(template: str, tokenizers: dict[str, tuple[Path, Any]],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """speculators' common-prefix boundary (scaffold) and its BoundaryUnstableError (counting): the same rows, or none."""
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizers["chatml"][0]))
    tokenizer.chat_template = template
    outcomes = SpeculatorsConvention(tokenizer, 4096).prepare([conversation_of(i, c) for i, c in enumerate(CONVERSATIONS)])
    for index, conv in enumerate(CONVERSATIONS):
        theirs = _theirs_speculators(tokenizer, conv, 4096, monkeypatch)
        assert [(r.input_ids, r.loss_mask) for r in outcomes[index].rows] == theirs, index
        if template is COUNTING:
            error = outcomes[index].error
            assert theirs == [] and error is not None and error.reason == "template not prefix-stable"
    assert template is COUNTING or sum(len(o.rows) for o in outcomes) > len(CONVERSATIONS)


def test_unknown_role_is_refused_where_speculators_guesses(tokenizers: dict[str, tuple[Path, Any]],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinned difference: speculators maps an unknown role (here ShareGPT's "bing") to assistant and supervises it;
    prepare records the row as "unknown role" rather than guess."""
    tokenizer = tokenizers["chatml"][1]
    conv = {"conversations": [{"from": "human", "value": "hi"}, {"from": "bing", "value": "searching"}]}
    assert len(_theirs_speculators(tokenizer, conv, 4096, monkeypatch)) == 1
    with pytest.raises(Exception, match="has from 'bing'; known roles"):
        conversation_of(0, conv)
