"""Run in a fresh process (inductor's ISA probe runs once per process):
``python isa_probe_worker.py probe`` prints inductor's own answer; ``python isa_probe_worker.py
known '<json list>'`` starts the probe with that answer as ``known`` and prints what inductor
then picks and how many test libraries it built."""

import json
import sys

from torch._inductor import cpu_vec_isa

from torchcompile_kit import _dynamo

builds = []
real_check_build = cpu_vec_isa.VecISA.check_build


def counting_check_build(self, code):
    builds.append(str(self))
    return real_check_build(self, code)


cpu_vec_isa.VecISA.check_build = counting_check_build
if sys.argv[1] == "probe":
    print(json.dumps({"isas": _dynamo.probed_cpu_isas(), "builds": len(builds)}))
else:
    _dynamo.start_cpu_isa_probe(known=json.loads(sys.argv[2]))
    assert _dynamo.wait_for_cpu_isa_probe(timeout=300)
    print(json.dumps({"isas": _dynamo.probed_cpu_isas(), "builds": len(builds)}))
