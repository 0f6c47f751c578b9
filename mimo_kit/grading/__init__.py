"""Group graders, GRS rubric synthesis and the rollout-group workspace (Report §4.3)."""

from mimo_kit.grading.agreement import AgreementConfig, CheckedGrader, cross_agreement, ranking_tau, self_agreement
from mimo_kit.grading.group import (
                                    AXES,
                                    GradedTrajectory,
                                    GraderConfig,
                                    GroupVerdict,
                                    GroupWorkspace,
                                    LLMGroupGrader,
                                    RuleGroupGrader,
                                    tier_factors,
)
from mimo_kit.grading.grs import Rubric, RubricItem, synthesize_rubric

__all__ = ["AXES", "GradedTrajectory", "GraderConfig", "GroupVerdict", "GroupWorkspace", "LLMGroupGrader",
           "RuleGroupGrader", "tier_factors", "Rubric", "RubricItem", "synthesize_rubric", "AgreementConfig",
           "CheckedGrader", "cross_agreement", "ranking_tau", "self_agreement"]
