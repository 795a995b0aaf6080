"""The dump writer's own safetensors encoder: files safetensors reads back bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hsextract.contract.files import tensor_file
from hsextract.contract.files.tensor_file import write_safetensors


def read_back(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str] | None]:
    with safe_open(str(path), framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}, handle.metadata()  # noqa: SIM118


def test_tensors_and_metadata_round_trip(tmp_path: Path) -> None:
    tensors = {
        "input_ids": torch.arange(7),
        "aux_hidden_states": torch.randn(7, 3, 5).bfloat16(),
        "final_hidden_state": torch.randn(7, 5),
        "half": torch.randn(2, 2).half(),
        "empty": torch.zeros(0, 5),
    }
    size = write_safetensors(tmp_path / "a.safetensors", tensors, {"rid": "hsx-000000001-n7"})
    assert size == (tmp_path / "a.safetensors").stat().st_size
    got, metadata = read_back(tmp_path / "a.safetensors")
    assert metadata == {"rid": "hsx-000000001-n7"}
    assert set(got) == set(tensors)
    for name, tensor in tensors.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    header_length = int.from_bytes((tmp_path / "a.safetensors").read_bytes()[:8], "little")
    assert header_length % 8 == 0  # the data starts 8-byte aligned


def test_views_and_non_contiguous_tensors_are_written_as_their_values(tmp_path: Path) -> None:
    base = torch.randn(6, 4, 5)
    rows = base[2:5]  # a row range of a bigger buffer, as the sink writes one request's rows
    permuted = base.permute(1, 0, 2)
    write_safetensors(tmp_path / "b.safetensors", {"rows": rows, "permuted": permuted})
    got, _ = read_back(tmp_path / "b.safetensors")
    assert torch.equal(got["rows"], rows) and torch.equal(got["permuted"], permuted)


def test_short_writes_are_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensor_file, "_MAX_WRITE", 7)  # every writev call moves at most 7 bytes
    tensors = {"x": torch.randn(33, 3), "y": torch.arange(5)}
    write_safetensors(tmp_path / "c.safetensors", tensors)
    got, _ = read_back(tmp_path / "c.safetensors")
    assert torch.equal(got["x"], tensors["x"]) and torch.equal(got["y"], tensors["y"])


def test_device_tensors_and_unknown_dtypes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not store"):
        write_safetensors(tmp_path / "d.safetensors", {"c": torch.zeros(2, dtype=torch.complex64)})
    with pytest.raises(ValueError, match="copy it to the host"):
        write_safetensors(tmp_path / "e.safetensors", {"m": torch.zeros(2, device="meta")})


@pytest.mark.parametrize(
    "tensors",
    [
        # the speculators sample in the model's dtype, and in FP8 (the library puts the scales before the states)
        {"token_ids": torch.arange(9), "hidden_states": torch.randn(9, 4, 16).bfloat16()},
        {
            "token_ids": torch.arange(9),
            "hidden_states": torch.randn(9, 4, 16).to(torch.float8_e4m3fn),
            "hidden_states_scales": torch.rand(9, 1, 1),
        },
        # every dtype the writer stores, two of one dtype (they go by name)
        {
            "zeta": torch.randn(3),
            "alpha": torch.randn(2),
            **{f"t_{dtype}".replace("torch.", ""): torch.ones(2).to(dtype) for dtype in tensor_file._DTYPES},
        },
    ],
    ids=["bf16", "fp8", "every_dtype"],
)
def test_pieces_in_library_order_are_the_bytes_of_save_file(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """The speculators writer writes these pieces: the file must be what safetensors' own save_file makes."""
    from safetensors.torch import save_file

    save_file(tensors, str(tmp_path / "library.safetensors"))
    ours = b"".join(bytes(piece) for piece in tensor_file.safetensors_stream(tensor_file.in_library_order(tensors)))
    assert ours == (tmp_path / "library.safetensors").read_bytes()


@pytest.mark.parametrize("piece_bytes", [1, 3 * 4 * 5 * 2, 1000, 1 << 20])
def test_a_stacked_tensor_is_written_as_the_bytes_of_its_whole_cat(
    tmp_path: Path, piece_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stacked builds ``cat(parts, dim=1)`` a few tokens at a time: the file is byte for byte safetensors' own of the
    whole ``cat``, whatever the piece size (one token, one token exactly, a part of the tokens, all of them)."""
    from safetensors.torch import save_file

    monkeypatch.setattr(tensor_file, "STACKED_PIECE_BYTES", piece_bytes)

    aux, final = torch.randn(7, 3, 5).bfloat16(), torch.randn(7, 5).bfloat16()
    ids = torch.arange(7)
    whole = {"token_ids": ids, "hidden_states": torch.cat([aux, final.unsqueeze(1)], dim=1)}
    save_file(whole, str(tmp_path / "library.safetensors"))
    hidden = tensor_file.Stacked((aux, final[:, None]))
    stacked: dict[str, torch.Tensor | tensor_file.Stacked] = {"token_ids": ids, "hidden_states": hidden}
    pieces = tensor_file.safetensors_stream(tensor_file.in_library_order(stacked))
    written = 0
    with open(tmp_path / "stacked.safetensors", "wb") as out:
        for piece in pieces:  # each piece before the next: they share one buffer
            out.write(bytes(piece))
            written += 1
    assert (tmp_path / "stacked.safetensors").read_bytes() == (tmp_path / "library.safetensors").read_bytes()
    assert hidden.shape == (7, 4, 5)
    token_bytes = 4 * 5 * 2
    assert written == 2 + -(-7 // max(1, piece_bytes // token_bytes))  # the header, the ids, then the pieces


def test_a_stacked_tensor_of_no_tokens_writes_no_bytes() -> None:
    empty = tensor_file.Stacked((torch.zeros(0, 3, 5).bfloat16(), torch.zeros(0, 1, 5).bfloat16()))
    assert empty.nbytes() == 0 and list(empty.pieces()) == []
