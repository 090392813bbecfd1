package admission

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/url"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/policies"
)

// ProviderTimeoutSeconds is how long Gatekeeper waits for nodeguard's answer
// (the Provider's timeout): below Gatekeeper's own webhook timeout (3 s by
// default), so a slow answer is Gatekeeper's denial naming nodeguard, not a
// timeout of the whole review. nodeguard answers within it.
const ProviderTimeoutSeconds = 2

// ProviderGVR is Gatekeeper's external data Provider.
var ProviderGVR = schema.GroupVersionResource{Group: "externaldata.gatekeeper.sh", Version: "v1beta1", Resource: "providers"}

// BuildProvider returns the Gatekeeper Provider named name that sends the
// K8sNodeGuardExternal template's keys to nodeguard serve: its external data
// route (with Cluster, /externaldata/clusters/NS/NAME) at URL or in Service,
// trusting the CABundle nodeguard's certificate is signed by.
func BuildProvider(name string, opts WebhookConfigOptions) (*unstructured.Unstructured, error) {
	client, err := clientConfig(opts, "/externaldata", "Gatekeeper")
	if err != nil {
		return nil, err
	}
	if svc := client.Service; svc != nil {
		// Gatekeeper calls a URL: the Service's in-cluster name, port 443.
		client.URL = new((&url.URL{Scheme: "https", Host: svc.Name + "." + svc.Namespace + ".svc", Path: *svc.Path}).String())
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": ProviderGVR.GroupVersion().String(),
		"kind":       "Provider",
		"metadata":   map[string]any{"name": name, "labels": map[string]any{"app.kubernetes.io/name": "nodeguard", kube.ManagedByLabel: "nodeguard"}},
		"spec": map[string]any{
			"url":      *client.URL,
			"timeout":  int64(ProviderTimeoutSeconds),
			"caBundle": base64.StdEncoding.EncodeToString(opts.CABundle),
		},
	}}, nil
}

// ProviderName is the Provider the K8sNodeGuardExternal template asks, as
// the embedded policy (which the template is generated from) declares it.
func ProviderName(ctx context.Context) (string, error) {
	compiled, err := policies.Compile()
	if err != nil {
		return "", err
	}
	return policies.ProviderName(ctx, compiled)
}

// ProviderYAML renders a Provider for kubectl apply.
func ProviderYAML(p *unstructured.Unstructured) ([]byte, error) {
	out, err := yaml.Marshal(p.Object)
	if err != nil {
		return nil, fmt.Errorf("render Provider: %w", err)
	}
	return out, nil
}

// ApplyProvider creates or updates the Provider in the cluster of client
// (server-side apply: nodeguard owns url, timeout and caBundle).
func ApplyProvider(ctx context.Context, client dynamic.Interface, p *unstructured.Unstructured) error {
	_, err := kube.ApplyOwned(ctx, client, kube.Owned{Resource: ProviderGVR, Object: p})
	return err
}
