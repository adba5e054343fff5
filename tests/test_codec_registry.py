"""A gossip codec is one declaration: the flags, the refusal of two codecs, the docs' table and CHOCO-SGD's
gamma follow from the registry, and a codec of one's own (--gossip-codec package.module:name) runs under
D-PSGD and CHOCO-SGD, checked where it enters."""

import json
import textwrap

import pytest

from p2pfl import testing
from p2pfl.gossip import codec_settings as gossip_settings
from p2pfl.gossip.codecs import CODECS, CodecSetting, GossipCodec
from p2pfl.settings.fields import fraction
from tests.test_conformance import TINY

TOY = '''
import math

import torch

from p2pfl.gossip.codecs import Compressed, GossipCodec


class HalfCodec(GossipCodec):
    """Sends the first half of the coordinates (a toy sparsifier)."""

    name = "first-half"
    choco_gamma = 0.2

    def encode(self, x, seed, round_index, peer):
        return Compressed((x[: math.ceil(x.numel() / 2)].clone(),))

    def decode(self, message, size):
        values = message.parts[0]
        return torch.arange(len(values), device=values.device), values


class NoGamma(HalfCodec):
    name = "no-gamma"
    choco_gamma = None


class Broken(HalfCodec):
    name = "broken"

    def decode(self, message, size):
        return None, message.parts[0]  # half the row where the whole one is promised


def half():
    return HalfCodec()


def not_a_codec():
    return "half"
'''

ARGS = [*TINY, "--rounds", "3", "--test-samples", "100", "--static"]  # static: CHOCO keeps state per neighbour


@pytest.fixture
def toy(tmp_path, monkeypatch):
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / "toy_codecs.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(folder))
    return "toy_codecs"


def rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algo", ["dpsgd", "choco"])
def test_a_codec_of_ones_own_runs_under_dpsgd_and_choco(toy, tmp_path, algo):
    out, dense = tmp_path / "own", tmp_path / "dense"
    done = testing.run_in_process([*ARGS, "--algo", algo, "--gossip-codec", f"{toy}:HalfCodec", "--out", str(out)])
    assert done.returncode == 0, done.stderr
    base = ["--gossip-topk", "1"] if algo == "choco" else []
    assert testing.run_in_process([*ARGS, "--algo", algo, *base, "--out", str(dense)]).returncode == 0
    for row in rows(out):
        assert row["bytes_sent"] < 0.6 * row["bytes_dense"]  # half the values (and no indices sent)
    assert rows(out)[-1]["test_acc"] != rows(dense)[-1]["test_acc"] or rows(out) != rows(dense)
    config = (out / "config.toml").read_text()
    assert f'gossip_codec = "{toy}:HalfCodec"' in config
    if algo == "choco":
        assert "choco_gamma = 0.2" in config  # the codec's own gamma, as declared
    same = testing.run_in_process(
        [*ARGS, "--algo", algo, "--gossip-codec", f"{toy}:half", "--out", str(tmp_path / "f")]
    )
    assert same.returncode == 0, same.stderr
    assert rows(tmp_path / "f") == rows(out) or all(  # a function that returns the codec: the same run
        {k: v for k, v in a.items() if not k.endswith("_s") and k not in testing.MACHINE_FACTS}
        == {k: v for k, v in b.items() if not k.endswith("_s") and k not in testing.MACHINE_FACTS}
        for a, b in zip(rows(tmp_path / "f"), rows(out))
    )


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["--algo", "choco", "--gossip-codec", "{toy}:NoGamma"],
            "declares no consensus step (its choco_gamma); give --choco-gamma",
        ),
        (["--algo", "dpsgd", "--gossip-codec", "{toy}:not_a_codec"], "returned a str, not a p2pfl.GossipCodec"),
        (["--algo", "dpsgd", "--gossip-codec", "{toy}:math"], "names a module, not a GossipCodec class or a function"),
        (["--algo", "dpsgd", "--gossip-codec", "half"], "takes a codec of your own as package.module:name"),
        (
            ["--algo", "dpsgd", "--gossip-codec", "{toy}:HalfCodec", "--gossip-topk", "0.1"],
            "top-k and {toy}:HalfCodec are two codecs of one message; give one of --gossip-topk, --gossip-randk, "
            "--gossip-quant-bits and --gossip-codec",
        ),
        (["--algo", "dpsgd", "--gossip-codec", "{toy}:Broken"], "the gossip codec broken decoded no indices"),
    ],
)
def test_a_bad_codec_is_one_line(toy, tmp_path, args, line):
    args = [a.format(toy=toy) for a in args]
    done = testing.run_in_process([*ARGS, *args, "--out", str(tmp_path / "r")])
    assert done.returncode == 2, done.stderr
    assert line.format(toy=toy) in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_declared_codec_gets_its_flag_its_docs_row_and_its_choco_gamma():
    """What a built-in codec declares is all the project needs: derived settings, table and refusal."""
    from p2pfl.docs import codec_table

    class EveryOther(GossipCodec):
        name = "every-other"
        setting = CodecSetting("gossip_every_other", "float", 1.0, fraction, "send every other weight")
        message = "the weights at even coordinates"
        wire_bytes = "4 ceil(D / 2)"
        choco_gamma = None

    try:
        assert CODECS["every-other"] is EveryOther
        fields = {name: field for name, _, field in gossip_settings._fields()}
        assert fields["gossip_every_other"].default == 1.0
        assert fields["gossip_every_other"].metadata["help"] == "send every other weight"
        assert (
            "| `--gossip-every-other P` | the weights at even coordinates | 4 ceil(D / 2) | none: give" in codec_table()
        )
        assert "--gossip-every-other" in gossip_settings.codec_flags()
        with pytest.raises(ValueError, match="two gossip codecs are named 'every-other'"):
            type("Again", (GossipCodec,), {"name": "every-other", "setting": EveryOther.setting})
    finally:
        CODECS.pop("every-other", None)
