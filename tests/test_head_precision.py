"""Heads under mixed precision (models/head_precision.py): projection heads run in float32 with
autocast off; the transformer heads that declare MIXED_PRECISION run under the trunk's
autocast, so their blocks compute in the autocast dtype."""
import torch
from torch import nn

from ssl_engine.models import head_precision
from ssl_engine.models.head_precision import float32_heads
from ssl_engine.models.heads.mae_decoder import MAEDecoder
from ssl_engine.models.heads.mlp import MLP


def block_dtypes(decoder: MAEDecoder, features, mask, autocast: bool):
    """The dtype of the first decoder block's MLP output and of the decoder's output, with the
    CPU counted as a device where such heads run under autocast (on a real CPU they do not)."""
    seen = []
    handle = decoder.blocks[0].mlp.fc1.register_forward_hook(
        lambda module, args, out: seen.append(out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        with float32_heads(features) as run:
            output = run(decoder, run.input(features), mask=mask)
    handle.remove()
    return seen[0], output.dtype


def test_transformer_heads_run_under_the_trunks_autocast(monkeypatch):
    monkeypatch.setattr(head_precision, "AUTOCAST_DEVICES", ("cuda", "cpu"))
    torch.manual_seed(0)
    decoder = MAEDecoder(in_dim=16, patch_size=2, in_chans=1, decoder_dim=8, depth=1,
                         num_heads=2)
    mask = torch.zeros(2, 2, 2, dtype=torch.bool)
    mask[:, 0, :] = True  # 2 of the 4 patches masked in each image
    features = torch.randn(2, 3, 16).to(torch.bfloat16)  # class token + 2 visible, from a trunk
    assert block_dtypes(decoder, features, mask, autocast=True) == (torch.bfloat16,
                                                                    torch.bfloat16)
    # without autocast nothing is cast
    assert block_dtypes(decoder, features.float(), mask, autocast=False) == (torch.float32,
                                                                             torch.float32)


def test_transformer_heads_stay_in_float32_on_a_cpu():
    """On a CPU the transformer heads run in float32 like the others (faster there)."""
    torch.manual_seed(0)
    decoder = MAEDecoder(in_dim=16, patch_size=2, in_chans=1, decoder_dim=8, depth=1,
                         num_heads=2)
    mask = torch.zeros(2, 2, 2, dtype=torch.bool)
    mask[:, 0, :] = True
    features = torch.randn(2, 3, 16).to(torch.bfloat16)
    assert block_dtypes(decoder, features, mask, autocast=True) == (torch.float32,
                                                                    torch.float32)


def test_projection_heads_stay_in_float32_under_autocast():
    torch.manual_seed(0)
    head = MLP([16, 8, 4])
    assert not getattr(head, "MIXED_PRECISION", False)
    trunk = nn.Linear(4, 16)
    x = torch.randn(3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        features = trunk(x)
        assert features.dtype == torch.bfloat16  # the trunk under autocast
        with float32_heads(features) as run:
            output = run(head, run.input(features))
        after = trunk(x)  # autocast is on again after the heads
    assert output.dtype == torch.float32
    assert after.dtype == torch.bfloat16
    # the head's float32 result is that of float32 arithmetic on the upcast features
    expected = head(features.float())
    assert torch.equal(output, expected)
