# The enforcer's second entry point (see decision.rego for the package).
package nodeguard

import data.nodeguard.orphans

# METADATA
# title: Orphan verdict
# description: |
#   The verdict of nodeguard.orphans for input.node, taking everything from
#   input so one prepared query (data.nodeguard.orphan) judges every Node:
#   input.node, input.inventory (Gatekeeper's layout), input.parameters,
#   input.now (RFC 3339), input.grace (a Go duration, default 5m) and
#   input.matchProviderID (default false).
# entrypoint: true
orphan := orphans.verdict(
	input.node,
	object.get(input, "inventory", {}),
	object.get(input, "parameters", {}),
	input.now,
	object.get(input, "grace", orphans.default_grace),
	object.get(input, "matchProviderID", false) == true,
)
