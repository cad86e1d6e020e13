"""mobilenet_v3_head and vision_transformer_head: VISSL's parameter names, their computation
written out by hand, and their initialisation."""
import pytest
import torch

from ssl_engine.config import AttrDict
from ssl_engine.models import MODEL_HEADS
from ssl_engine.models.base_ssl_model import set_head_batch_norms


def test_mobilenet_v3_head_with_channel_norm_by_hand():
    torch.manual_seed(0)
    head = MODEL_HEADS.get("mobilenet_v3_head")(in_channels=6, mid_channels=10, num_classes=3,
                                                with_bn=True).eval()
    assert sorted(head.state_dict()) == sorted([
        "channel_bn.weight", "channel_bn.bias", "channel_bn.running_mean",
        "channel_bn.running_var", "channel_bn.num_batches_tracked", "classifier.0.weight",
        "classifier.0.bias", "classifier.3.weight", "classifier.3.bias"])
    head.channel_bn.running_mean.uniform_(-1, 1)
    head.channel_bn.running_var.uniform_(0.5, 2)
    for p in head.parameters():
        p.data.uniform_(-0.5, 0.5)
    x = torch.randn(4, 6, 1, 1)
    bn = head.channel_bn
    normed = ((x.flatten(1) - bn.running_mean) / torch.sqrt(bn.running_var + 1e-5) * bn.weight
              + bn.bias)
    hidden = normed @ head.classifier[0].weight.t() + head.classifier[0].bias
    hidden = hidden * torch.clamp(hidden + 3, 0, 6) / 6  # hardswish
    expected = hidden @ head.classifier[3].weight.t() + head.classifier[3].bias
    torch.testing.assert_close(head(x), expected)
    torch.testing.assert_close(head(x.flatten(1)), expected)  # [N, C] input as well
    # MODEL.HEAD.BATCHNORM_EPS / MOMENTUM reach the channel norm
    set_head_batch_norms(torch.nn.ModuleList([head]),
                         AttrDict(BATCHNORM_EPS=1e-3, BATCHNORM_MOMENTUM=0.01))
    assert (bn.eps, bn.momentum) == (1e-3, 0.01)
    with pytest.raises(ValueError, match="expects 6 input features"):
        head(torch.randn(2, 5))


def test_mobilenet_v3_head_init_and_dropout():
    torch.manual_seed(0)
    head = MODEL_HEADS.get("mobilenet_v3_head")(in_channels=960, num_classes=1000)
    assert head.channel_bn is None
    weight = head.classifier[0].weight
    assert weight.shape == (1280, 960) and abs(weight.std().item() - 0.01) < 5e-4
    assert head.classifier[2].p == 0.2 and not head.classifier[0].bias.any()


def test_vision_transformer_head_pretraining_and_finetuning_layouts():
    torch.manual_seed(0)
    pretrain = MODEL_HEADS.get("vision_transformer_head")(in_plane=64, hidden_dim=32,
                                                          num_classes=5)
    assert list(pretrain.state_dict()) == ["layers.pre_logits.weight", "layers.pre_logits.bias",
                                           "layers.head.weight", "layers.head.bias"]
    x = torch.randn(3, 64)
    layers = pretrain.layers
    expected = torch.tanh(x @ layers.pre_logits.weight.t() + layers.pre_logits.bias)
    expected = expected @ layers.head.weight.t() + layers.head.bias
    torch.testing.assert_close(pretrain(x), expected)
    # LeCun normal: variance 1 / fan_in, truncated at 2 std
    std = layers.pre_logits.weight.std().item()
    assert abs(std - 64 ** -0.5) < 0.01
    assert layers.pre_logits.weight.abs().max() <= 2 * 64 ** -0.5 / 0.8796 + 1e-6
    finetune = MODEL_HEADS.get("vision_transformer_head")(in_plane=64, num_classes=5)
    assert list(finetune.state_dict()) == ["layers.head.weight", "layers.head.bias"]
    assert finetune(x).shape == (3, 5)
    assert abs(finetune.layers.head.weight.std().item() - 0.02) < 0.004


def test_swav_head_with_weight_normalised_prototypes_and_gelu_by_hand():
    torch.manual_seed(0)
    head = MODEL_HEADS.get("swav_head")(dims=[6, 8, 4], num_clusters=[5], return_embeddings=False,
                                        activation_name="GELU", use_weight_norm_prototypes=True)
    assert sorted(head.state_dict()) == [
        "projection_head.0.bias", "projection_head.0.weight", "projection_head.2.bias",
        "projection_head.2.weight", "prototypes0.weight_g", "prototypes0.weight_v"]
    with torch.no_grad():
        head.prototypes0.weight_g.uniform_(0.5, 2.0)
    x = torch.randn(3, 6)
    first, second = head.projection_head[0], head.projection_head[2]
    hidden = torch.nn.functional.gelu(x @ first.weight.t() + first.bias)
    embedding = hidden @ second.weight.t() + second.bias
    embedding = embedding / embedding.norm(dim=1, keepdim=True)
    v, g = head.prototypes0.weight_v, head.prototypes0.weight_g
    expected = embedding @ (g * v / v.norm(dim=1, keepdim=True)).t()
    (scores,) = head(x)
    torch.testing.assert_close(scores, expected)
    before = head.prototypes0.weight.detach().clone()
    head.normalize_prototypes()  # SwAV's renormalisation leaves weight-normalised sets alone
    torch.testing.assert_close(head.prototypes0.weight, before)


def test_identity_head_passes_the_trunk_output_on():
    x = torch.randn(2, 7)
    assert torch.equal(MODEL_HEADS.get("identity")()(x), x)
