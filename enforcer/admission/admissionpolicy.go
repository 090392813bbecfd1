// This file builds nodeguard's guard inside a workload API
// server (a Cluster in mode admission-policy): a ValidatingAdmissionPolicy
// and its binding, and the ConfigMap of released Nodes they read. The CEL
// holds no rule: it looks the verdict up. A Node DELETE is allowed only when
// the ConfigMap releases that Node's name with its UID (so a Node re-created
// under the name is not released); the rule's verdicts are
// policies/nodeguard/released's, published by nodeguard. Exempt users and
// groups are rendered into the policy's match conditions from the rule's
// declared parameters.

package admission

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/policies"
)

// PolicyEntry is the Rego the verdicts come from; its METADATA carries the name,
// kind and version of what is generated from it.
const PolicyEntry = "nodeguard/released/released.rego"

// Where the guard lives in a workload cluster.
const (
	// ParamsNamespace and ParamsName name the ConfigMap of released Nodes.
	ParamsNamespace = kube.Namespace
	ParamsName      = "nodeguard-released"
	// BlockerPrefix starts the key of a blocker's text: "_" is no character
	// of a Node name, so no Node's key can be mistaken for one.
	BlockerPrefix = "blocker_"
	// VersionAnnotation carries the version of the generated policy.
	VersionAnnotation = "nodeguard.io/policy-version"
)

// GVRs of what is installed.
var (
	PolicyGVR  = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"}
	BindingGVR = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicybindings"}
	ParamsGVR  = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
)

// PolicyInfo is the METADATA of PolicyEntry.
type PolicyInfo struct {
	Name, Kind, Version, Title string
}

// LoadPolicyInfo reads the METADATA of PolicyEntry.
func LoadPolicyInfo() (PolicyInfo, error) {
	title, _, custom, err := policies.PackageMetadata(PolicyEntry, "policy", "kind", "version")
	if err != nil {
		return PolicyInfo{}, err
	}
	return PolicyInfo{Title: title, Name: custom["policy"], Kind: custom["kind"], Version: custom["version"]}, nil
}

// PolicyOptions say what to build.
type PolicyOptions struct {
	// ExemptUsers and ExemptGroups may delete any Node (the rule's declared
	// parameters of those names).
	ExemptUsers, ExemptGroups []string
	// Action is how the binding enforces (validationActions): Deny unless
	// set; a rollout starts with DryRun (Audit) or Warn.
	Action rule.Action
}

// BuildPolicy returns the policy and its binding.
func BuildPolicy(info PolicyInfo, opts PolicyOptions) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding, error) {
	actions, err := validationActions(opts.Action)
	if err != nil {
		return nil, nil, err
	}
	meta := metav1.ObjectMeta{Name: info.Name, Labels: map[string]string{"app.kubernetes.io/managed-by": kube.ManagedBy},
		Annotations: map[string]string{VersionAnnotation: info.Version}}
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: meta,
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			ParamKind: &admissionregistrationv1.ParamKind{APIVersion: "v1", Kind: "ConfigMap"},
			// Every field the API server would default is set, so the stored
			// policy equals what is built and the fleet writes it only when
			// it differs.
			MatchConstraints: &admissionregistrationv1.MatchResources{
				MatchPolicy:       new(admissionregistrationv1.Equivalent),
				NamespaceSelector: &metav1.LabelSelector{}, ObjectSelector: &metav1.LabelSelector{},
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
						Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes"},
							Scope: new(admissionregistrationv1.AllScopes)},
					},
				}},
			},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "not-exempt", Expression: notExempt(opts.ExemptUsers, opts.ExemptGroups)}},
			FailurePolicy:   new(admissionregistrationv1.Fail),
			Variables: []admissionregistrationv1.Variable{
				{Name: "node", Expression: "oldObject.metadata.name"},
				{Name: "released", Expression: "has(params.data) ? params.data : {}"},
			},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "variables.node in variables.released && variables.released[variables.node] == oldObject.metadata.uid",
				Reason:     new(metav1.StatusReasonForbidden),
				// A fixed message too: shown if the expression fails.
				Message: "nodeguard: this Node is not released: a Machine, InfraMachine or pool linked to it may still exist",
				// A blocker's text is the rule's message, which names the Node;
				// the other quotes its name as the rule's messages do.
				MessageExpression: `"nodeguard: " + ` +
					`((("` + BlockerPrefix + `" + variables.node) in variables.released) ? variables.released["` + BlockerPrefix + `" + variables.node] : ` +
					`"Node \"" + variables.node + "\" cannot be deleted: nodeguard has not released it: a Machine, InfraMachine or pool linked to it may still exist (or this Node was re-created under its name). ` +
					`Cluster API deletes it once its InfraMachine is gone; ` + "`nodeguard check`" + ` in the management cluster says what blocks it.")`,
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: meta,
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: info.Name,
			ParamRef: &admissionregistrationv1.ParamRef{Name: ParamsName, Namespace: ParamsNamespace,
				ParameterNotFoundAction: new(admissionregistrationv1.DenyAction)},
			ValidationActions: actions,
		},
	}
	return policy, binding, nil
}

func validationActions(a rule.Action) ([]admissionregistrationv1.ValidationAction, error) {
	switch a {
	case "", rule.ActionDeny:
		return []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}, nil
	case rule.ActionWarn:
		return []admissionregistrationv1.ValidationAction{admissionregistrationv1.Warn}, nil
	case rule.ActionDryRun:
		return []admissionregistrationv1.ValidationAction{admissionregistrationv1.Audit}, nil
	}
	return nil, fmt.Errorf("admission policy: action %q is none of %s, %s, %s", a, rule.ActionDeny, rule.ActionWarn, rule.ActionDryRun)
}

// notExempt is the match condition: the policy applies to every user who is
// not exempt (an exempt one is not judged at all; the API server cannot warn
// on an allowed request as nodeguard's webhook does).
func notExempt(users, groups []string) string {
	return "!(request.userInfo.username in " + list(users) + ") && " +
		"!(has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in " + list(groups) + "))"
}

// list is a CEL list of string literals (sorted, so the policy is stable).
func list(values []string) string {
	var quoted []string
	for _, v := range slices.Sorted(slices.Values(values)) {
		quoted = append(quoted, strconv.Quote(v)) // Go's escapes are CEL's for a string
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// PolicyRules are what nodeguard's identity needs in a workload cluster to keep
// the guard (kube.IdentityOptions.Owns): the policy and binding by name (create
// cannot be limited by name), the ConfigMap of released Nodes, and get on
// every ConfigMap, which the API server requires of whoever writes a policy
// whose paramKind is ConfigMap.
func PolicyRules(info PolicyInfo) []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"},
			Verbs: []string{"create"}},
		{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"},
			ResourceNames: []string{info.Name}, Verbs: []string{"get", "list", "watch", "patch", "update", "delete"}},
		// The API server lets a user write a policy whose paramKind is
		// ConfigMap only if it may get every ConfigMap (no escalation
		// through the policy's reads): get, not list or watch.
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "get"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{ParamsName},
			Verbs: []string{"get", "list", "watch", "patch", "update", "delete"}},
	}
}

// ReleaseVerdict is what is published of one Node.
type ReleaseVerdict struct {
	Node, UID string
	Released  bool
	// Blocker is the rule's text for a blocked Node in teardown ("": none).
	Blocker string
}

// MaxParamsBytes bounds the ConfigMap's data: the API server stores at most
// 1 MiB an object; the rest is left for metadata and managed fields.
const MaxParamsBytes = 900 << 10

// maxBlockerBytes cuts one blocker's text, as an Event's message is cut.
const maxBlockerBytes = 1024

// PolicyParams is the ConfigMap of released Nodes: each released Node's name
// with its UID, and the blocker text of blocked ones that have one. What
// does not fit in limit bytes is left out, blockers first, then releases
// (in name order, so the same verdicts give the same object): a Node left
// out stays denied, which is safe; omitted counts them.
func PolicyParams(verdicts []ReleaseVerdict, limit int) (cm *corev1.ConfigMap, omitted int, err error) {
	data := map[string]string{}
	size := 0
	sorted := append([]ReleaseVerdict(nil), verdicts...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Node < sorted[j].Node })
	var blockers []ReleaseVerdict
	for _, v := range sorted {
		if v.Node == "" {
			return nil, 0, errors.New("admission policy: a verdict without a Node name")
		}
		if !v.Released {
			if v.Blocker != "" {
				blockers = append(blockers, v)
			}
			continue
		}
		if v.UID == "" {
			return nil, 0, fmt.Errorf("admission policy: released Node %s has no UID", v.Node)
		}
		if n := len(v.Node) + len(v.UID); size+n <= limit {
			data[v.Node], size = v.UID, size+n
		} else {
			omitted++
		}
	}
	for _, v := range blockers {
		k, text := BlockerPrefix+v.Node, v.Blocker
		if len(text) > maxBlockerBytes {
			text = strings.ToValidUTF8(text[:maxBlockerBytes-3], "") + "..."
		}
		if n := len(k) + len(text); size+n <= limit {
			data[k], size = text, size+n
		} else {
			omitted++
		}
	}
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ParamsNamespace, Name: ParamsName,
			Labels: map[string]string{"app.kubernetes.io/managed-by": kube.ManagedBy}},
		Data: data,
	}, omitted, nil
}
