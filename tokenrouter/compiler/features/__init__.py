"""The step features a routing rule or a router network reads: each declared once in
`catalog.py`, in the terms `declare.py` defines. Import them from here, which fills the
registry."""

from tokenrouter.compiler.features import catalog
from tokenrouter.compiler.features.declare import (EMBEDDING, FEATURES, HEAD_ROW, HIDDEN, LOGITS, STEP_NAMES, Call,
                                                   FeatureError, Int, Scalar, StepFeature, Vector, Word, called,
                                                   feature_of)

__all__ = ["EMBEDDING", "FEATURES", "HEAD_ROW", "HIDDEN", "LOGITS", "STEP_NAMES", "Call", "FeatureError", "Int",
           "Scalar", "StepFeature", "Vector", "Word", "called", "catalog", "feature_of"]
