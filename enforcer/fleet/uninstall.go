package fleet

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/dynamic"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// Uninstall removes from a workload cluster what the fleet installs there:
// the webhook configuration, the admission policy's binding, then (once the
// API server no longer applies the binding: bindingApplyTime after its
// delete) the policy and the released Nodes, and nodeguard's identity, each
// only where nodeguard's label marks it. Removed in that order, no released
// Node is denied on the way (an applied binding without its released Nodes
// denies every Node delete). The identity's Namespace stays: others may keep
// things in it. It returns what it removed, and the first object it could
// not.
func Uninstall(ctx context.Context, dyn dynamic.Interface) ([]string, error) {
	info, err := admission.LoadPolicyInfo()
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	objs := []policyObject{
		{gvr: admission.WebhookConfigGVR, name: admission.Name},
		{gvr: admission.BindingGVR, name: info.Name},
		{gvr: admission.PolicyGVR, name: info.Name},
		{gvr: admission.ParamsGVR, namespace: admission.ParamsNamespace, name: admission.ParamsName},
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
