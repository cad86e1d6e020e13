"""Heads: modules applied to the trunk output, each registered with ``register_model_head``."""
from ssl_engine.models.heads.aim_head import AIMPredictionHead  # noqa: F401  (registers it)
from ssl_engine.models.heads.data2vec_decoder import Data2VecDecoder  # noqa: F401  (registers it)
from ssl_engine.models.heads.capi_head import CAPIHead  # noqa: F401  (registers "capi_head")
from ssl_engine.models.heads.dino_head import DINOHead  # noqa: F401  (registers "dino_head")
from ssl_engine.models.heads.dinov3_head import DINOv3Head  # noqa: F401  (registers it)
from ssl_engine.models.heads.eval_mlp import EvalMLP  # noqa: F401  (registers "eval_mlp")
from ssl_engine.models.heads.ijepa_predictor import IJEPAPredictor  # noqa: F401  (registers it)
from ssl_engine.models.heads.identity import IdentityHead  # noqa: F401  (registers "identity")
from ssl_engine.models.heads.ibot_distillation_head import IBOTDistillationHead  # noqa: F401
from ssl_engine.models.heads.ibot_head import IBOTHead  # noqa: F401  (registers "ibot_head")
from ssl_engine.models.heads.mae_decoder import MAEDecoder  # noqa: F401  (registers it)
from ssl_engine.models.heads.mlp import MLP  # noqa: F401  (registers "mlp")
from ssl_engine.models.heads.mobilenet_v3_head import MobileNetV3Head, MobileNetV3TimmHead  # noqa: F401
from ssl_engine.models.heads.msn_head import MSNHead  # noqa: F401  (registers "msn_head")
from ssl_engine.models.heads.siamese_concat_view import SiameseConcatView  # noqa: F401
from ssl_engine.models.heads.swav_head import SwAVPrototypesHead  # noqa: F401  (registers it)
from ssl_engine.models.heads.vision_transformer_head import VisionTransformerHead  # noqa: F401
