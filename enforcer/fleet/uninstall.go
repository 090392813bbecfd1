package fleet

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// Uninstall removes from a workload cluster what the fleet installs there:
// the webhook configuration, the admission policies' bindings, then (once
// the API server no longer applies them: bindingApplyTime after their
// delete) the policies, what nodeguard 0.3 left, the verdicts on the Nodes,
// and nodeguard's identity, each only where nodeguard's label marks it.
// Removed in that order, no released Node is denied on the way (an applied
// binding without its policy denies every Node delete), and the verdicts go
// once no guard policy keeps them nodeguard's alone. The identity's
// Namespace stays: others may keep things in it. It returns what it
// removed, and the first object it could not.
func Uninstall(ctx context.Context, dyn dynamic.Interface) ([]string, error) {
	info, err := admission.LoadPolicyInfo()
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	objs := []policyObject{
		{gvr: admission.WebhookConfigGVR, name: admission.Name},
		{gvr: admission.BindingGVR, name: info.Name},
		{gvr: admission.BindingGVR, name: info.Guard},
		{gvr: admission.BindingGVR, name: admission.LegacyPolicyName},
		{gvr: admission.PolicyGVR, name: info.Name},
		{gvr: admission.PolicyGVR, name: info.Guard},
		{gvr: admission.PolicyGVR, name: admission.LegacyPolicyName},
		{gvr: admission.ParamsGVR, namespace: admission.LegacyParamsNamespace, name: admission.LegacyParamsName},
		{gvr: nodeGVR}, // the verdicts
	}
	ident, err := kube.IdentityObjects(kube.IdentityOptions{})
	if err != nil {
		return nil, err
	}
	for _, o := range ident {
		if o.Object.GetKind() != "Namespace" {
			objs = append(objs, policyObject{gvr: o.Resource, namespace: o.Object.GetNamespace(), name: o.Object.GetName()})
		}
	}
	var removed []string
	unbound := false
	for _, o := range objs {
		if o.gvr == admission.PolicyGVR && unbound {
			select {
			case <-ctx.Done():
				return removed, ctx.Err()
			case <-time.After(bindingApplyTime):
			}
			unbound = false // waited once for all
		}
		if o.gvr == nodeGVR {
			n, err := removeVerdicts(ctx, dyn, info)
			if err != nil {
				return removed, err
			}
			if n > 0 {
				removed = append(removed, fmt.Sprintf("the verdicts on %d Nodes", n))
			}
			continue
		}
		deleted, err := kube.DeleteOwned(ctx, dyn, o.gvr, o.namespace, o.name)
		unbound = unbound || (deleted && o.gvr == admission.BindingGVR)
		switch {
		case err != nil && !isNotServed(err):
			// The rest would fail alike (an API server that does not answer).
			return removed, err
		case deleted && o.namespace != "":
			removed = append(removed, fmt.Sprintf("%s %s/%s", o.gvr.Resource, o.namespace, o.name))
		case deleted:
			removed = append(removed, o.gvr.Resource+" "+o.name)
		}
	}
	return removed, nil
}

// removeVerdicts removes nodeguard's annotations from every Node carrying
// them; it returns how many it changed.
func removeVerdicts(ctx context.Context, dyn dynamic.Interface, info admission.PolicyInfo) (int, error) {
	patch, err := admission.VerdictPatch(info, admission.ReleaseVerdict{})
	if err != nil {
		return 0, err
	}
	n := 0
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := dyn.Resource(nodeGVR).List(ctx, opts)
		if err != nil {
			return n, fmt.Errorf("list Nodes: %w", err)
		}
		for _, node := range list.Items {
			if admission.VerdictOf(info, node.GetAnnotations()) == (admission.ReleaseVerdict{}) {
				continue
			}
			if _, err := dyn.Resource(nodeGVR).Patch(ctx, node.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return n, fmt.Errorf("remove the verdict on Node %s: %w", node.GetName(), err)
			}
			n++
		}
		if opts.Continue = list.GetContinue(); opts.Continue == "" {
			return n, nil
		}
	}
}
