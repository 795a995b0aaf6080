"""The spot check's ``/generate`` request and answer: the engine's own hidden states of one row.

SGLang's field: ``return_hidden_states: true`` on the request (the server needs
``--enable-return-hidden-states``, which ``--enable-return-aux-hidden-states`` implies in 0.5.23:
``arg_groups/serving_hook.py`` ``handle_return_hidden_states_mode`` sets the server's mode to
``full``), answered in ``meta_info.hidden_states``: a list with one entry per forward that produced
rows, the first being the prompt's ``[rows, width]``. What those rows are in SGLang 0.5.23
(docs/spot-check.md has the source lines):

* with aux capture on (every extraction server), the aux states packed ``[rows, K*H]`` in capture
  order (``layers/logits_processor.py`` ``_get_hidden_states_to_store``: ``pack_aux_hidden_states``);
  the final post-norm state stays in ``last_hidden_states``, which is not copied into the answer;
* with chunked prefill, only the rows of the prompt's last extend pass: the last
  ``((T - 1) % chunk) + 1`` positions (``managers/scheduler_components/batch_result_processor.py``:
  a middle chunk's output is not committed, so ``_append_prefill_hidden_states`` stores nothing for it).

The embedded server answers the same field with one unbatched forward of the prompt (every position,
no chunking) and adds :data:`FINAL_STATES_KEY`: the final post-norm state ``[T, H]``, which SGLang
does not return, :data:`PRENORM_STATES_KEY`: the same state before the final norm, the alternative
a dump path on the wrong side of the norm would hold (the comparison measures the post-norm state's
distance from it), and :data:`NEIGHBOURS_KEY`: the layers either side of the first aux layer, the
alternatives of a layer set off by one.

The embedded server answers in binary when asked (``Accept: application/vnd.hsextract.states+safetensors``,
:data:`STATES_MEDIA_TYPE`): the same tensors as safetensors, in the engine's own dtype. The JSON answer of a
64-token 8B-shaped check is 20 MB of decimal floats, 50 ms to encode and 150 ms to parse, each holding its
side's GIL; the binary one is 4 MB and parsed without copying. SGLang ignores the header and answers JSON.

The rid has no dump prefix (:data:`SPOT_CHECK_RID_PREFIX`), so no hook dumps it. ``max_new_tokens``
is 1: SGLang's hidden states of a prompt come with its first sampled token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hsextract.errors import BadRequestError

if TYPE_CHECKING:  # the CLI and the launcher import this module before torch is there
    import torch

#: request key (SGLang's name)
RETURN_HIDDEN_STATES_KEY = "return_hidden_states"
#: ``meta_info`` key of the answer (SGLang's name)
HIDDEN_STATES_KEY = "hidden_states"
#: ``meta_info`` key only the embedded server sets: the final post-norm state of every position
FINAL_STATES_KEY = "hsextract_final_hidden_states"
#: ``meta_info`` key only the embedded server sets: the last layer's output before the final norm
PRENORM_STATES_KEY = "hsextract_final_prenorm_hidden_states"
#: ``meta_info`` key only the embedded server sets: the layers either side of the first aux layer, ``[T, 2H]``
#: (its capture index - 1, then + 1): a layer set off by one moves every aux layer, and the first is where a
#: layer moves the residual stream most and the engine's own noise is least
NEIGHBOURS_KEY = "hsextract_first_aux_neighbour_states"
#: the embedded server's binary answer, asked for with ``Accept``: safetensors of :data:`STATE_TENSORS`
STATES_MEDIA_TYPE = "application/vnd.hsextract.states+safetensors"
#: the binary answer's tensor names, in :class:`SpotCheckAnswer`'s field order
STATE_TENSORS = ("hidden", "final", "prenorm", "neighbours")
#: rids of spot checks: never the dump prefix (``contract.rids``: ``<prefix>-<row>-n<T>``)
SPOT_CHECK_RID_PREFIX = "hsxspot"


def spot_check_rid(row: int, num_tokens: int, attempt: int = 0) -> str:
    """``hsxspot_<row>_n<T>_<attempt>``: underscores, so it never parses as a dump rid of any prefix."""
    return f"{SPOT_CHECK_RID_PREFIX}_{row:09d}_n{num_tokens}_{attempt}"


def is_spot_check(body: Any) -> bool:
    """Whether a ``/generate`` body asks for the engine's own hidden states."""
    return isinstance(body, dict) and body.get(RETURN_HIDDEN_STATES_KEY) is True


@dataclass(frozen=True)
class SpotCheckRequest:
    """One prompt whose hidden states the engine returns in its answer (never dumped)."""

    rid: str
    input_ids: list[int]

    @classmethod
    def parse(cls, body: Any, vocab_size: int) -> SpotCheckRequest:
        """The request a server accepts, or :class:`BadRequestError` naming what is wrong (HTTP 400)."""
        from hsextract.contract.generate import GenerateRequest

        if not isinstance(body, dict):
            raise BadRequestError("not_an_object", "request body must be a JSON object")
        plain = GenerateRequest.parse({"input_ids": body.get("input_ids"), "rid": body.get("rid")}, vocab_size)
        return cls(plain.rid, plain.input_ids)

    def to_json(self) -> dict[str, Any]:
        return {
            "input_ids": self.input_ids,
            "rid": self.rid,
            RETURN_HIDDEN_STATES_KEY: True,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        }


@dataclass(frozen=True)
class SpotCheckAnswer:
    """The engine's states of the prompt's last ``rows`` positions.

    ``hidden`` ``[rows, width]`` (float32 once parsed; the engine's dtype on the server): SGLang's packed
    aux states (``width == K*H``), or the final
    state alone (``width == H``) from a server without aux capture. ``final`` and ``prenorm`` ``[rows, H]``
    (the final state after and before the final norm) and ``neighbours`` ``[rows, 2H]`` (the layers either
    side of the first aux layer): only from the embedded server."""

    rid: str | None
    hidden: torch.Tensor
    final: torch.Tensor | None = None
    prenorm: torch.Tensor | None = None
    neighbours: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return int(self.hidden.shape[0])

    def to_json_bytes(self, prompt_tokens: int) -> bytes:
        """The answer as SGLang shapes it (the embedded server's), encoded: tens of MB of floats, so orjson
        straight from the tensors' memory (``json`` took 2 s for a 256-token 8B-shaped answer, holding the GIL)."""
        import orjson

        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": {"type": "length", "length": 1},
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 1,
            "cached_tokens": 0,
            HIDDEN_STATES_KEY: [self.hidden.float().numpy()],
        }
        extra = ((FINAL_STATES_KEY, self.final), (PRENORM_STATES_KEY, self.prenorm), (NEIGHBOURS_KEY, self.neighbours))
        for key, states in extra:
            if states is not None:
                meta[key] = states.float().numpy()
        return orjson.dumps({"output_ids": [0], "meta_info": meta}, option=orjson.OPT_SERIALIZE_NUMPY)

    def to_states_bytes(self) -> bytes:
        """The answer as :data:`STATES_MEDIA_TYPE`: the tensors as they are, the rid in the metadata."""
        from safetensors.torch import save

        found = zip(STATE_TENSORS, (self.hidden, self.final, self.prenorm, self.neighbours), strict=True)
        return save({name: t.contiguous() for name, t in found if t is not None}, metadata={"id": self.rid or ""})

    @classmethod
    def parse_states_bytes(cls, content: bytes) -> SpotCheckAnswer | None:
        """:meth:`to_states_bytes` read back, float32; None when the body is not such an answer."""
        from safetensors import SafetensorError
        from safetensors.torch import load

        try:
            tensors = load(content)
        except (SafetensorError, ValueError):
            return None
        if "hidden" not in tensors or any(t.dim() != 2 for t in tensors.values()):
            return None
        floats = {name: t.float() for name, t in tensors.items()}
        rid = _safetensors_metadata(content).get("id") or None
        return cls(rid, floats["hidden"], floats.get("final"), floats.get("prenorm"), floats.get("neighbours"))

    @classmethod
    def parse_bytes(cls, content: bytes) -> SpotCheckAnswer | None:
        """:meth:`parse` of a response body as received (orjson: the body is tens of MB of floats)."""
        import orjson

        try:
            body = orjson.loads(content)
        except orjson.JSONDecodeError:
            return None
        return cls.parse(body)

    @classmethod
    def parse(cls, body: Any) -> SpotCheckAnswer | None:
        """The states in an answer body; None when it holds none (a server without the feature)."""
        if isinstance(body, list) and body:
            body = body[0]
        meta = body.get("meta_info") if isinstance(body, dict) else None
        if not isinstance(meta, dict):
            return None
        passes = meta.get(HIDDEN_STATES_KEY)
        if not isinstance(passes, list) or not passes or not isinstance(passes[0], list) or not passes[0]:
            return None
        try:
            hidden = _tensor(passes[0])
            final, prenorm, neighbours = (_rows(meta.get(key)) for key in (FINAL_STATES_KEY, PRENORM_STATES_KEY, NEIGHBOURS_KEY))
        except (TypeError, ValueError):
            return None
        if hidden.dim() == 1:  # return_hidden_states "last": one row
            hidden = hidden.unsqueeze(0)
        if hidden.dim() != 2 or any(t is not None and t.dim() != 2 for t in (final, prenorm, neighbours)):
            return None
        rid = meta.get("id")
        return cls(rid if isinstance(rid, str) else None, hidden, final, prenorm, neighbours)


def _safetensors_metadata(content: bytes) -> dict[str, str]:
    """The ``__metadata__`` of safetensors bytes (its header: a little-endian u64 length, then JSON)."""
    import json

    length = int.from_bytes(content[:8], "little")
    metadata = json.loads(content[8 : 8 + length]).get("__metadata__")
    return metadata if isinstance(metadata, dict) else {}


def _tensor(rows: Any) -> torch.Tensor:
    """float32 from nested lists (numpy first: 6x faster than ``torch.tensor`` on lists)."""
    import numpy
    import torch

    return torch.from_numpy(numpy.asarray(rows, dtype=numpy.float32))


def _rows(value: Any) -> torch.Tensor | None:
    return None if value is None else _tensor(value)
