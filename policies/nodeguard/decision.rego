# METADATA
# title: nodeguard enforcer entry point
# description: |
#   Takes everything from input, so one prepared query (data.nodeguard.decision)
#   serves every request: input.review (an AdmissionRequest), input.inventory
#   (Gatekeeper's layout) and input.parameters (a Constraint's spec.parameters).
#   A second entry point, data.nodeguard.orphan (orphans.rego), judges whether a
#   Node is an orphan the same way.
package nodeguard

import data.lib.nodeguard

# METADATA
# title: Decision
# description: |
#   The decision object (lib.nodeguard.decide): allowed, reason, blockers,
#   unverified, messages, warnings. The enforcer counts and logs decisions by
#   its reason.
# entrypoint: true
decision := nodeguard.decide(input.review, object.get(input, "inventory", {}), object.get(input, "parameters", {}))
