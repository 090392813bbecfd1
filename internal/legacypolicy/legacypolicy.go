// Package legacypolicy builds what nodeguard 0.3's mode admission-policy
// installed in a workload cluster (a ValidatingAdmissionPolicy reading a
// ConfigMap of released Nodes), for the tests of the upgrade from it and for
// the benchmark that sets its cost beside today's policies. Nothing but
// tests uses it.
package legacypolicy

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// Objects are 0.3's policy, binding and ConfigMap releasing the Nodes of
// released (name: UID).
func Objects(released map[string]string) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding, *corev1.ConfigMap) {
	meta := metav1.ObjectMeta{Name: admission.LegacyPolicyName, Labels: map[string]string{kube.ManagedByLabel: kube.ManagedBy}}
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: meta,
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			ParamKind: &admissionregistrationv1.ParamKind{APIVersion: "v1", Kind: "ConfigMap"},
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes"}},
					},
				}},
			},
			FailurePolicy: new(admissionregistrationv1.Fail),
			Variables: []admissionregistrationv1.Variable{
				{Name: "node", Expression: "oldObject.metadata.name"},
				{Name: "released", Expression: "has(params.data) ? params.data : {}"},
			},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "variables.node in variables.released && variables.released[variables.node] == oldObject.metadata.uid",
				Reason:     new(metav1.StatusReasonForbidden),
				Message:    "nodeguard: this Node is not released",
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: meta,
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: admission.LegacyPolicyName,
			ParamRef: &admissionregistrationv1.ParamRef{Name: admission.LegacyParamsName, Namespace: admission.LegacyParamsNamespace,
				ParameterNotFoundAction: new(admissionregistrationv1.DenyAction)},
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	cm := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: admission.LegacyParamsNamespace, Name: admission.LegacyParamsName,
			Labels: map[string]string{kube.ManagedByLabel: kube.ManagedBy}},
		Data: released,
	}
	return policy, binding, cm
}
