// This file builds nodeguard's guard inside a workload API server (a
// Cluster in mode admission-policy): two ValidatingAdmissionPolicies with
// their bindings, and no params. nodeguard writes its verdict on each Node
// (VerdictPatch): the released annotation holds the Node's UID on a Node the
// rule lets anyone delete. The delete policy compares it with the UID of the
// Node being deleted, so a Node re-created under the name (a new UID) is not
// released; it holds no rule. The guard policy lets only nodeguard's identity
// set, change or remove the annotations, on nodes and nodes/status, CREATE
// and UPDATE: NodeRestriction leaves a kubelet free to write its Node's
// annotations, and RBAC cannot limit a patch to some of them. Without params
// the policies cost the same at any number of Nodes, need no read of any
// ConfigMap, and can be loaded from kube-apiserver's static manifests (1.37),
// where no one can delete them through the API. The names, annotations and
// version come from policies/nodeguard/released's METADATA; exempt users and
// groups are rendered into match conditions from the rule's parameters.

package admission

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/rule"
	"github.com/nodeguard/nodeguard/policies"
)

// PolicyEntry is the Rego the verdicts come from; its METADATA carries the
// names, annotations, kind and version of what is generated from it.
const PolicyEntry = "nodeguard/released/released.rego"

const (
	// VersionAnnotation carries the version of the generated policies.
	VersionAnnotation = "nodeguard.io/policy-version"
	// StaticSuffix ends the name of every object kube-apiserver loads from
	// its static manifests directory (Kubernetes 1.37).
	StaticSuffix = ".static.k8s.io"
)

// Legacy names the objects of the mode as nodeguard 0.3 built it (a policy
// reading a ConfigMap of released Nodes): the fleet removes them once the
// policies of today are proven there.
const (
	LegacyPolicyName      = "nodeguard"
	LegacyParamsNamespace = kube.Namespace
	LegacyParamsName      = "nodeguard-released"
)

// GVRs of what is installed.
var (
	PolicyGVR  = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"}
	BindingGVR = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicybindings"}
	ParamsGVR  = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
)

// PolicyInfo is the METADATA of PolicyEntry.
type PolicyInfo struct {
	// Name is the delete policy's (and its binding's), Guard the guard
	// policy's (and its binding's).
	Name, Guard string
	// Released and Blocker are the annotations of the verdict on a Node.
	Released, Blocker    string
	Kind, Version, Title string
}

// LoadPolicyInfo reads the METADATA of PolicyEntry.
func LoadPolicyInfo() (PolicyInfo, error) {
	title, _, custom, err := policies.PackageMetadata(PolicyEntry, "policy", "guard", "released_annotation", "blocker_annotation", "kind", "version")
	if err != nil {
		return PolicyInfo{}, err
	}
	return PolicyInfo{Title: title, Name: custom["policy"], Guard: custom["guard"], Released: custom["released_annotation"],
		Blocker: custom["blocker_annotation"], Kind: custom["kind"], Version: custom["version"]}, nil
}

// Annotations are the verdict's annotations, in a fixed order.
func (i PolicyInfo) Annotations() []string { return []string{i.Released, i.Blocker} }

// VerdictPaths are where the verdict is on a Node (a Node cache keeps them).
func (i PolicyInfo) VerdictPaths() []rule.Path {
	return []rule.Path{{"metadata", "annotations", i.Released}, {"metadata", "annotations", i.Blocker}}
}

// Static returns the names kube-apiserver's static manifests need.
func (i PolicyInfo) Static() PolicyInfo {
	i.Name, i.Guard = i.Name+StaticSuffix, i.Guard+StaticSuffix
	return i
}

// PolicyOptions say what to build.
type PolicyOptions struct {
	// ExemptUsers and ExemptGroups may delete any Node (the rule's declared
	// parameters of those names).
	ExemptUsers, ExemptGroups []string
	// Action is how the delete binding enforces (validationActions): Deny
	// unless set; a rollout starts with DryRun (Audit) or Warn. The guard
	// binding always denies: a forged verdict is never only warned of.
	Action rule.Action
	// Identity is the user who alone may write the verdicts (default
	// kube.Username, nodeguard's ServiceAccount there).
	Identity string
}

// Policies are what the mode installs.
type Policies struct {
	Delete        *admissionregistrationv1.ValidatingAdmissionPolicy
	DeleteBinding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	Guard         *admissionregistrationv1.ValidatingAdmissionPolicy
	GuardBinding  *admissionregistrationv1.ValidatingAdmissionPolicyBinding
}

// BuildPolicies returns the delete and guard policies with their bindings.
// Every field the API server would default is set, so a stored object equals
// what is built and the fleet writes it only when it differs.
func BuildPolicies(info PolicyInfo, opts PolicyOptions) (Policies, error) {
	actions, err := validationActions(opts.Action)
	if err != nil {
		return Policies{}, err
	}
	identity := opts.Identity
	if identity == "" {
		identity = kube.Username
	}
	released, blocker := annotation("oldObject", info.Released), annotation("oldObject", info.Blocker)
	del := policy(info, info.Name, []admissionregistrationv1.OperationType{admissionregistrationv1.Delete}, []string{"nodes"},
		[]admissionregistrationv1.MatchCondition{{Name: "not-exempt", Expression: notExempt(opts.ExemptUsers, opts.ExemptGroups)}},
		admissionregistrationv1.Validation{
			Expression: released + " == oldObject.metadata.uid",
			Reason:     new(metav1.StatusReasonForbidden),
			// A fixed message too: shown if the message expression fails.
			Message: "nodeguard: this Node is not released: a Machine, InfraMachine or pool linked to it may still exist",
			// A blocker is the rule's message, which names the Node; the
			// other quotes its name as the rule's messages do.
			MessageExpression: `"nodeguard: " + (` + blocker + ` != "" ? ` + blocker + ` : ` +
				`"Node \"" + oldObject.metadata.name + "\" cannot be deleted: nodeguard has not released it: a Machine, InfraMachine or pool linked to it may still exist (or this Node was re-created under its name). ` +
				`Cluster API deletes it once its InfraMachine is gone; ` + "`nodeguard check`" + ` in the management cluster says what blocks it.")`,
		})
	guard := policy(info, info.Guard,
		[]admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, []string{"nodes", "nodes/status"},
		[]admissionregistrationv1.MatchCondition{
			{Name: "not-nodeguard", Expression: "request.userInfo.username != " + strconv.Quote(identity)},
			// Only a request that touches a verdict pays for the validation:
			// a kubelet's status updates stop here.
			{Name: "touches-verdicts", Expression: touches(info)},
		},
		admissionregistrationv1.Validation{
			Expression: "false",
			Reason:     new(metav1.StatusReasonForbidden),
			Message: fmt.Sprintf("nodeguard: only nodeguard (%s) may set, change or remove the annotations %s and %s on a Node: they are its verdicts, which decide whether the Node may be deleted",
				identity, info.Released, info.Blocker),
		})
	return Policies{
		Delete: del, DeleteBinding: binding(info, info.Name, actions),
		Guard: guard, GuardBinding: binding(info, info.Guard, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}),
	}, nil
}

// Objects are the policies and bindings in the order they are installed:
// the guard before the delete policy, each policy before its binding.
func (p Policies) Objects() []any {
	return []any{p.Guard, p.GuardBinding, p.Delete, p.DeleteBinding}
}

func meta(info PolicyInfo, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Labels: map[string]string{kube.ManagedByLabel: kube.ManagedBy},
		Annotations: map[string]string{VersionAnnotation: info.Version}}
}

func policy(info PolicyInfo, name string, ops []admissionregistrationv1.OperationType, resources []string,
	conditions []admissionregistrationv1.MatchCondition, v admissionregistrationv1.Validation) *admissionregistrationv1.ValidatingAdmissionPolicy {
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: meta(info, name),
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{
				MatchPolicy:       new(admissionregistrationv1.Equivalent),
				NamespaceSelector: &metav1.LabelSelector{}, ObjectSelector: &metav1.LabelSelector{},
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: ops,
						Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: resources,
							Scope: new(admissionregistrationv1.AllScopes)},
					},
				}},
			},
			MatchConditions: conditions,
			FailurePolicy:   new(admissionregistrationv1.Fail),
			Validations:     []admissionregistrationv1.Validation{v},
		},
	}
}

func binding(info PolicyInfo, name string, actions []admissionregistrationv1.ValidationAction) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: meta(info, name),
		Spec:       admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name, ValidationActions: actions},
	}
}

// annotation is a CEL expression for an annotation of obj ("" when absent).
func annotation(obj, key string) string {
	k := strconv.Quote(key) // Go's escapes are CEL's for a string
	return fmt.Sprintf(`(has(%[1]s.metadata.annotations) && %[2]s in %[1]s.metadata.annotations ? %[1]s.metadata.annotations[%[2]s] : "")`, obj, k)
}

// touches is the guard's match condition: a Node created with a verdict, or
// updated with one added, changed or removed.
func touches(info PolicyInfo) string {
	var created, changed []string
	for _, k := range info.Annotations() {
		created = append(created, annotation("object", k)+` != ""`)
		changed = append(changed, annotation("object", k)+" != "+annotation("oldObject", k))
	}
	return `request.operation == "CREATE" ? (` + strings.Join(created, " || ") + `) : (` + strings.Join(changed, " || ") + `)`
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
		quoted = append(quoted, strconv.Quote(v))
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// PolicyRules are what nodeguard's identity needs in a workload cluster to keep
// the guard (kube.IdentityOptions.Owns): the policies and bindings by name
// (create cannot be limited by name; the legacy ones to remove them), and
// patch on Nodes to write the verdicts (the guard policy, not RBAC, keeps
// those patches to nodeguard's annotations).
func PolicyRules(info PolicyInfo) []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"},
			Verbs: []string{"create"}},
		{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"},
			ResourceNames: []string{info.Name, info.Guard, info.Static().Name, info.Static().Guard, LegacyPolicyName},
			Verbs:         []string{"get", "list", "watch", "patch", "update", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{LegacyParamsName}, Verbs: []string{"get", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"patch"}},
	}
}

// ReleaseVerdict is the verdict on one Node.
type ReleaseVerdict struct {
	// UID is the Node's, written as the released annotation ("": not
	// released).
	UID string
	// Blocker is the rule's text for a blocked Node in teardown ("": none).
	Blocker string
}

// maxBlockerBytes cuts one blocker's text, as an Event's message is cut.
const maxBlockerBytes = 1024

// Verdict is the verdict to write on a Node of uid: released or not, with
// the blocker text (cut to a readable length) of a blocked one.
func Verdict(uid string, released bool, blocker string) ReleaseVerdict {
	if released {
		return ReleaseVerdict{UID: uid}
	}
	if len(blocker) > maxBlockerBytes {
		blocker = strings.ToValidUTF8(blocker[:maxBlockerBytes-3], "") + "..."
	}
	return ReleaseVerdict{Blocker: blocker}
}

// VerdictOf reads the verdict written on a Node (its annotations).
func VerdictOf(info PolicyInfo, annotations map[string]string) ReleaseVerdict {
	return ReleaseVerdict{UID: annotations[info.Released], Blocker: annotations[info.Blocker]}
}

// VerdictPatch is the JSON merge patch that writes v on a Node: an empty
// value removes its annotation.
func VerdictPatch(info PolicyInfo, v ReleaseVerdict) ([]byte, error) {
	value := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	return json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		info.Released: value(v.UID), info.Blocker: value(v.Blocker)}}})
}
