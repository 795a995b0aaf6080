"""The embedded server dumps a request that asks for FP8 in speculators' FP8 layout, quantized on the
device before the copy, and its values are the model-dtype dump's within FP8 rounding."""

from __future__ import annotations

import httpx
import torch

from hsextract.capture.embedded.request import EngineRequest
from hsextract.contract.files.dumps import Dump, read_dump
from hsextract.contract.files.fp8 import FP8_DTYPE, FP8_STORAGE, dequantize, max_error_over_amax, relative_frobenius_error
from hsextract.contract.rids import make_rid
from hsextract.contract.server_info import STORAGE_KEY

from .test_server import generate

H, K = 64, 3


def reference_states(plain: Dump, stacked: Dump, prenorm: bool) -> torch.Tensor:
    """``[T, K+1, H]`` of the model-dtype dumps of the same prompt: aux, then the final state the FP8 dump's last slot
    holds (a dump stacked with the pre-norm state has no post-norm one, the plain dump no pre-norm one)."""
    aux, final = plain.plain_states("this test")
    if not prenorm:
        return torch.cat([aux, final.unsqueeze(1)], dim=1)
    assert stacked.is_stacked and stacked.hidden_states is not None
    return stacked.hidden_states


def assert_fp8_matches(fp8: Dump, plain: Dump, stacked: Dump, prenorm: bool) -> None:
    assert fp8.is_fp8 and fp8.storage_dtype == FP8_STORAGE
    assert fp8.meta.storage_dtype == FP8_STORAGE and fp8.meta.final_slot == ("prenorm" if prenorm else "postnorm")
    assert fp8.meta.dtype == "bfloat16" and fp8.meta.num_aux_layers == K and fp8.meta.hidden_size == H
    assert fp8.hidden_states is not None and fp8.hidden_states_scales is not None
    tokens = plain.input_ids.shape[0]
    assert fp8.hidden_states.dtype == FP8_DTYPE and fp8.hidden_states.shape == (tokens, K + 1, H)
    assert fp8.hidden_states_scales.dtype == torch.float32 and fp8.hidden_states_scales.shape == (tokens, 1, 1)
    assert torch.equal(fp8.input_ids, plain.input_ids)
    assert fp8.aux_hidden_states is None and fp8.final_hidden_state is None
    reference = reference_states(plain, stacked, prenorm)
    restored = dequantize(fp8.hidden_states, fp8.hidden_states_scales, torch.float32)
    assert relative_frobenius_error(restored, reference).max < 0.07
    assert max_error_over_amax(restored, reference).max <= 2**-4 + 0.02  # bf16 noise of a different batch shape


def test_fp8_dumps_whole_and_chunked_match_the_bf16_dumps(model_dir, start_server) -> None:
    server = start_server(model_dir("llama", "bfloat16"), chunked_prefill_size=32)
    assert httpx.get(server.url + "/server_info").json()["fp8_per_request"] is True
    prompts = {"short": list(range(5, 25)), "long": [(7 * i) % 1000 for i in range(75)]}  # 75: three chunks of 32
    for row, (name, ids) in enumerate(prompts.items()):
        plain, stacked, fp8, fp8_post = (make_rid(10 * row + i, len(ids)) for i in (1, 4, 2, 3))
        assert generate(server.url, plain, ids).status_code == 200
        assert generate(server.url, stacked, ids, hsextract_final_prenorm=True).status_code == 200
        assert generate(server.url, fp8, ids, hsextract_final_prenorm=True, **{STORAGE_KEY: FP8_STORAGE}).status_code == 200
        assert generate(server.url, fp8_post, ids, **{STORAGE_KEY: FP8_STORAGE}).status_code == 200
        references = read_dump(server.dump_dir / plain), read_dump(server.dump_dir / stacked)
        assert_fp8_matches(read_dump(server.dump_dir / fp8), *references, prenorm=True)
        assert_fp8_matches(read_dump(server.dump_dir / fp8_post), *references, prenorm=False)
        if name == "long":
            assert read_dump(server.dump_dir / fp8).meta.extend_passes == 3
    bad = generate(server.url, make_rid(99, 3), [1, 2, 3], **{STORAGE_KEY: "float8_e5m2"})
    assert bad.status_code == 400 and STORAGE_KEY in bad.json()["error"]["message"]


def test_one_forward_mixing_fp8_and_bf16_requests(model_dir, start_server) -> None:
    server = start_server(model_dir("llama", "bfloat16"))
    engine = server.engine
    lengths = [9, 14, 6, 14]  # padded to 14: the FP8 rows are picked out of the padding too
    ids = [[(3 * i + 11 * r) % 1000 for i in range(n)] for r, n in enumerate(lengths)]
    storages = [FP8_STORAGE, None, FP8_STORAGE, None]
    mixed = [EngineRequest(make_rid(r + 1, n), ids[r], final_prenorm=r != 2, storage=storages[r]) for r, n in enumerate(lengths)]
    # One batched forward on this thread (the scheduler thread sits idle on its empty inbox).
    engine._forward_batch(mixed)
    for request in mixed:
        request.future.result(timeout=60)
    # alone, each prompt without and with the pre-norm state: the plain and the stacked references
    futures = [
        engine.submit(make_rid(r + base, n), ids[r], final_prenorm=base == 21) for base in (11, 21) for r, n in enumerate(lengths)
    ]
    for future in futures:
        future.result(timeout=60)
    for r, n in enumerate(lengths):
        got = read_dump(server.dump_dir / make_rid(r + 1, n))
        plain, stacked = (read_dump(server.dump_dir / make_rid(r + base, n)) for base in (11, 21))
        if storages[r] is None:  # asked for the pre-norm state: stacked
            assert got.is_stacked and got.hidden_states is not None and stacked.hidden_states is not None
            assert relative_frobenius_error(got.hidden_states, stacked.hidden_states).max < 0.02
        else:
            assert_fp8_matches(got, plain, stacked, prenorm=r != 2)
