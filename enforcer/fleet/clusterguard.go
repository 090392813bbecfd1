package fleet

import (
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// A ClusterGuard (nodeguard.io/v1alpha1) is the fleet's status of one CAPI
// Cluster, in the Cluster's namespace under its name and owned by it, so it
// goes with it: `kubectl get clusterguards -A` is the fleet at a glance, and
// its conditions are what GitOps tools read as health.
const (
	Group            = "nodeguard.io"
	Version          = "v1alpha1"
	ClusterGuardKind = "ClusterGuard"
)

// ClusterGuards is the ClusterGuard resource.
var ClusterGuards = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "clusterguards"}

// Condition types of a ClusterGuard, in the Kubernetes and CAPI v1beta2
// style: Guarded is the verdict, Reachable and Proven say which step of it
// held or failed.
const (
	ConditionGuarded   = "Guarded"
	ConditionReachable = "Reachable"
	ConditionProven    = "Proven"
)

// ClusterGuardCRD is the CustomResourceDefinition `make generate` writes for
// the chart, kustomize and the clusterctl components.
func ClusterGuardCRD() *apiextensionsv1.CustomResourceDefinition {
	str := func(desc string) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Type: "string", Description: desc}
	}
	boolean := func(desc string) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Type: "boolean", Description: desc}
	}
	condition := apiextensionsv1.JSONSchemaProps{
		Type:     "object",
		Required: []string{"type", "status", "lastTransitionTime", "reason"},
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"type":               str("Guarded, Reachable or Proven."),
			"status":             {Type: "string", Enum: []apiextensionsv1.JSON{{Raw: []byte(`"True"`)}, {Raw: []byte(`"False"`)}, {Raw: []byte(`"Unknown"`)}}},
			"observedGeneration": {Type: "integer", Format: "int64", Minimum: ptr.To(0.0)},
			"lastTransitionTime": {Type: "string", Format: "date-time", Description: "When the status last changed."},
			"reason":             str("Why, in CamelCase: Guarded, or the reason it is not (NoKubeconfig, Unreachable, NotInstalled, StaleCaBundle, ReviewNotReceived, NoNodes, OptedOut, NotSelected, ModeUnsupported, Deleting, Dryrun)."),
			"message":            str("What an operator reads."),
		},
	}
	status := apiextensionsv1.JSONSchemaProps{
		Type: "object",
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"mode":      str("How the workload cluster routes Node deletes to the rule: webhook or admission-policy."),
			"action":    str("The enforcement action the last proof found in force there (deny, warn or dryrun)."),
			"identity":  str("The user nodeguard writes and proves as there, as that API server names it."),
			"wired":     boolean("nodeguard's configuration is installed there as it wants it."),
			"caCurrent": boolean("The installed configuration trusts the current CA bundle."),
			"lastProof": {Type: "string", Format: "date-time", Description: "When a dry-run Node delete last reached nodeguard's route for this Cluster; refreshed at most every 10 minutes while nothing else changes (the metric nodeguard_workload_cluster_last_proof_timestamp_seconds is live)."},
			"conditions": {
				Type:         "array",
				Items:        &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &condition},
				XListType:    ptr.To("map"),
				XListMapKeys: []string{"type"},
			},
		},
	}
	guarded := `.status.conditions[?(@.type=="Guarded")]`
	return &apiextensionsv1.CustomResourceDefinition{
		TypeMeta: metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: ClusterGuards.Resource + "." + Group,
			Labels: map[string]string{"app.kubernetes.io/name": "nodeguard"}},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: Group,
			Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural: ClusterGuards.Resource, Singular: "clusterguard", Kind: ClusterGuardKind, ListKind: ClusterGuardKind + "List",
				ShortNames: []string{"cg"}, Categories: []string{"cluster-api"},
			},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: Version, Served: true, Storage: true,
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Description: "nodeguard's fleet status of the CAPI Cluster of the same namespace and name: whether a Node delete " +
						"in its workload cluster is judged by nodeguard's rule (docs/operate.md, \"The fleet\"). Written by `nodeguard serve --fleet`.",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"apiVersion": {Type: "string"}, "kind": {Type: "string"}, "metadata": {Type: "object"},
						"status": status,
					},
				}},
				AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{
					{Name: "Mode", Type: "string", JSONPath: ".status.mode"},
					{Name: "Guarded", Type: "string", JSONPath: guarded + ".status"},
					{Name: "Reason", Type: "string", JSONPath: guarded + ".reason"},
					{Name: "Action", Type: "string", JSONPath: ".status.action"},
					{Name: "Last Proof", Type: "date", JSONPath: ".status.lastProof"},
					{Name: "Identity", Type: "string", JSONPath: ".status.identity", Priority: 1},
					{Name: "Message", Type: "string", JSONPath: guarded + ".message", Priority: 1},
					{Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp"},
				},
			}},
		},
	}
}

// reachedReasons are the reasons that mean the workload API server answered.
var reachedReasons = map[string]bool{ReasonNotInstalled: true, ReasonStaleCABundle: true, ReasonReviewNotReceived: true,
	ReasonNoNodes: true, ReasonModeUnsupported: true, ReasonDryRun: true}

// conditions are a State's conditions, each changed when its verdict was
// (Since); the writer keeps an earlier time where a condition's status did
// not change.
func conditions(s State, generation int64) []metav1.Condition {
	cond := func(t string, ok metav1.ConditionStatus, reason, message string) metav1.Condition {
		return metav1.Condition{Type: t, Status: ok, Reason: reason, Message: message,
			ObservedGeneration: generation, LastTransitionTime: metav1.NewTime(s.Since)}
	}
	reason := CamelReason(s.Reason)
	if s.Guarded {
		return []metav1.Condition{
			cond(ConditionGuarded, metav1.ConditionTrue, ConditionGuarded, "a dry-run Node delete in the workload cluster was judged by nodeguard's rule"),
			cond(ConditionReachable, metav1.ConditionTrue, ConditionReachable, ""),
			cond(ConditionProven, metav1.ConditionTrue, ConditionProven, "the last dry-run Node delete reached nodeguard's route for this Cluster"),
		}
	}
	out := []metav1.Condition{cond(ConditionGuarded, metav1.ConditionFalse, reason, s.Message)}
	switch {
	case s.Reason == ReasonNoKubeconfig || s.Reason == ReasonUnreachable:
		out = append(out, cond(ConditionReachable, metav1.ConditionFalse, reason, s.Message),
			cond(ConditionProven, metav1.ConditionUnknown, reason, "not reached"))
	case reachedReasons[s.Reason]:
		proven := cond(ConditionProven, metav1.ConditionFalse, reason, s.Message)
		if s.Reason == ReasonDryRun {
			// The route judged the proof; it just does not deny.
			proven = cond(ConditionProven, metav1.ConditionTrue, ConditionProven, "the last dry-run Node delete reached nodeguard's route for this Cluster")
		}
		out = append(out, cond(ConditionReachable, metav1.ConditionTrue, ConditionReachable, ""), proven)
	default: // told to stay out, or going: not looked at
		out = append(out, cond(ConditionReachable, metav1.ConditionUnknown, reason, "not looked at"),
			cond(ConditionProven, metav1.ConditionUnknown, reason, "not looked at"))
	}
	return out
}

// CamelReason is a State reason as a condition reason: "no-kubeconfig" is
// NoKubeconfig.
func CamelReason(r string) string {
	var b strings.Builder
	for part := range strings.SplitSeq(r, "-") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}

// reasonOf is the State reason of a condition reason.
func reasonOf(camel string) string {
	for _, r := range append(Reasons(), ReasonNotReported) {
		if CamelReason(r) == camel {
			return r
		}
	}
	return camel
}

// clusterGuard is the ClusterGuard of a State, ns/name its Cluster's and
// owned by it; keep holds the conditions written before, whose times stand
// where a status did not change.
func clusterGuard(s State, ns, name string, owner metav1.OwnerReference, generation int64, keep []metav1.Condition) (*unstructured.Unstructured, []metav1.Condition) {
	conds := conditions(s, generation)
	for i, c := range conds {
		for _, k := range keep {
			if k.Type == c.Type && k.Status == c.Status {
				conds[i].LastTransitionTime = k.LastTransitionTime
			}
		}
	}
	status := map[string]any{"wired": s.Wired, "caCurrent": s.CACurrent}
	for k, v := range map[string]string{"mode": s.Mode, "action": s.Action, "identity": s.Identity} {
		if v != "" {
			status[k] = v
		}
	}
	if !s.LastProof.IsZero() {
		status["lastProof"] = s.LastProof.UTC().Format(time.RFC3339)
	}
	list := make([]any, 0, len(conds))
	for _, c := range conds {
		m := map[string]any{"type": c.Type, "status": string(c.Status), "reason": c.Reason,
			"lastTransitionTime": c.LastTransitionTime.UTC().Format(time.RFC3339), "observedGeneration": c.ObservedGeneration}
		if c.Message != "" {
			m["message"] = c.Message
		}
		list = append(list, m)
	}
	status["conditions"] = list
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version, "kind": ClusterGuardKind,
		"metadata": map[string]any{"namespace": ns, "name": name,
			"labels":          map[string]any{"app.kubernetes.io/name": "nodeguard", "cluster.x-k8s.io/cluster-name": name, kube.ManagedByLabel: kube.Owner},
			"ownerReferences": []any{map[string]any{"apiVersion": owner.APIVersion, "kind": owner.Kind, "name": owner.Name, "uid": string(owner.UID)}}},
		"status": status,
	}}, conds
}

// stateOf reads a ClusterGuard back as the State it was written from.
func stateOf(u *unstructured.Unstructured) State {
	s := State{Cluster: u.GetNamespace() + "/" + u.GetName()}
	s.Mode, _, _ = unstructured.NestedString(u.Object, "status", "mode")
	s.Action, _, _ = unstructured.NestedString(u.Object, "status", "action")
	s.Identity, _, _ = unstructured.NestedString(u.Object, "status", "identity")
	s.Wired, _, _ = unstructured.NestedBool(u.Object, "status", "wired")
	s.CACurrent, _, _ = unstructured.NestedBool(u.Object, "status", "caCurrent")
	if p, _, _ := unstructured.NestedString(u.Object, "status", "lastProof"); p != "" {
		s.LastProof, _ = time.Parse(time.RFC3339, p)
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] != ConditionGuarded {
			continue
		}
		s.Guarded = m["status"] == string(metav1.ConditionTrue)
		if !s.Guarded {
			r, _ := m["reason"].(string)
			s.Reason = reasonOf(r)
			s.Message, _ = m["message"].(string)
		}
		if t, _ := m["lastTransitionTime"].(string); t != "" {
			s.Since, _ = time.Parse(time.RFC3339, t)
		}
	}
	if len(conds) == 0 {
		s.Reason, s.Message = ReasonNotReported, "nodeguard serve --fleet has not written this ClusterGuard's status yet"
	}
	return s
}
