"""PEFT under torch.compile: refuse what breaks, compile in place, guard what changes at run time.

The topic's API; peft is imported only when a PEFT model is described.
"""

from .compile import check_peft_compile_safety, compile_peft
from .evaluation import evaluate_rules, rule_by_id, rule_in_force
from .facts import describe_peft_model
from .record import AdapterState, Decision, PeftCompileRecord, get_peft_compile_record
from .rule_table import RULES
from .schema import AdapterFacts, AdapterRule, SafetyFinding

__all__ = [
    # top level UX
    "check_peft_compile_safety",
    "compile_peft",
    "get_peft_compile_record",
    # what was decided, as data
    "AdapterState",
    "Decision",
    "PeftCompileRecord",
    # what the hook guards cost (counts; seconds on an idle machine)
    # the rule table, for tools and tests
    "RULES",
    "AdapterFacts",
    "AdapterRule",
    "SafetyFinding",
    "describe_peft_model",
    "evaluate_rules",
    "rule_by_id",
    "rule_in_force",
]
