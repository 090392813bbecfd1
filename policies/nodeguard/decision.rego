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
#   The decision object - allowed, blockers, unverified, messages, warnings.
#   A request the rule does not judge (not a DELETE of a core Node) also
#   carries judged: false, so the enforcer's metrics and logs can say so.
# entrypoint: true
decision := object.union(_decide, {"judged": false}) if {
	not nodeguard.judged(input.review)
} else := _decide

_decide := nodeguard.decide(input.review, object.get(input, "inventory", {}), object.get(input, "parameters", {}))
