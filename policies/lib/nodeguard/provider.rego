# Gatekeeper with fresh facts: the K8sNodeGuardExternal template asks nodeguard
# (`nodeguard serve`, as Gatekeeper's external data provider) for the objects
# linked to the Node, instead of reading Gatekeeper's synced data.inventory,
# and decides on them with decide/3 like every other runtime. These pure
# functions build the question and read the answer; only the template's entry
# point calls external_data, so everything here runs in `opa test`.
package lib.nodeguard

# METADATA
# title: Provider name
# description: |
#   The externaldata.gatekeeper.sh Provider the K8sNodeGuardExternal template
#   asks; nodeguard serve keeps a Provider of this name pointing at itself.
provider_name := "nodeguard"

# METADATA
# title: Provided parameters
# description: |
#   The parameters nodeguard's answer sets, overriding the Constraint's: the
#   InfraMachine and pool kinds nodeguard has synced (only what it watches
#   proves an absence) and the cluster scope of the provider route Gatekeeper
#   calls. Anything else nodeguard sends is ignored.
provided_parameters := {"infraMachineKinds", "infraMachinePoolKinds", "clusterName", "clusterNamespace"}

# METADATA
# title: Provider key
# description: |
#   The key sent to nodeguard for a review carrying a Node: the review's uid
#   and the Node's declared fields (node_fields), as JSON. The uid makes each
#   review's key its own, so Gatekeeper's response cache (3 minutes by
#   default) never answers a later review with an earlier one's facts.
#   nodeguard refuses a key without uid. Undefined without a Node.
provider_key(review) := json.marshal({"uid": object.get(review, "uid", ""), "node": json.filter(node, node_fields)}) if {
	node := _node(review)
}

# METADATA
# title: Provider facts
# description: |
#   What an external_data response says for key: {"inventory", "parameters"}
#   (Gatekeeper's data.inventory layout, and provided_parameters) when nodeguard
#   answered it, else {"error"} naming what went wrong. Every failure is an
#   error, never an empty answer: a system error (nodeguard unreachable, TLS,
#   timeout), an error for any key, an HTTP status other than 200 (0 when every
#   key came from Gatekeeper's cache), a missing or malformed answer.
provider_facts(response, key) := {"error": sprintf("Gatekeeper could not reach it: %s", [err])} if {
	err := object.get(response, "system_error", "")
	err != ""
} else := {"error": sprintf("it answered: %s", [_error_text(errors[0])])} if {
	errors := _entries(response, "errors")
	count(errors) > 0
} else := {"error": sprintf("it answered with HTTP status %v", [code])} if {
	code := object.get(response, "status_code", null)
	not code in {0, 200}
} else := facts if {
	answers := [value | some [k, value] in _entries(response, "responses"); k == key]
	count(answers) == 1
	facts := _facts(answers[0])
} else := {"error": "its answer holds no readable facts for this Node"}

_entries(response, name) := list if {
	list := object.get(response, name, [])
	is_array(list)
} else := []

# Each error is [key, message]; anything else is shown as it came.
_error_text(entry) := entry[1] if {
	is_string(entry[1])
} else := sprintf("%v", [entry])

_facts(value) := {"inventory": value.inventory, "parameters": object.filter(value.parameters, provided_parameters)} if {
	is_object(value.inventory)
	is_object(value.parameters)
}

# METADATA
# title: Decide with the provider's facts
# description: |
#   decide/3 on the facts of provider_facts, with the Constraint's parameters
#   and the provided ones over them; a judged review whose facts are an error
#   is denied (fail closed, reason unjudgeable: without the facts the Node
#   cannot be judged), naming the provider and the error. answer is {}
#   for a review that has no key (not judged, or no Node: decide/3 handles
#   both without facts).
decide_with_provider(review, answer, parameters) := _provider_denial(review, err) if {
	judged(review)
	err := answer.error
} else := decide(
	review,
	object.get(answer, "inventory", {}),
	object.union_n([default_parameters, _object_or_empty(parameters), object.get(answer, "parameters", {})]),
)

_provider_denial(review, err) := denial("unjudgeable", [{
	"message": concat(" ", [
		sprintf(
			"Node %q cannot be deleted: nodeguard's external data provider %q did not give the objects linked to it (%s), so Gatekeeper cannot prove their hosts are gone.",
			[object.get(review, "name", ""), provider_name, err],
		),
		sprintf(
			"Check that nodeguard serve runs and is ready, and that Provider %q's url and caBundle match it (kubectl get providers.externaldata.gatekeeper.sh -o yaml); retry then.",
			[provider_name],
		),
	]),
	"details": {"provider": provider_name, "error": err},
}])
