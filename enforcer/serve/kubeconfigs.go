package serve

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeguard/nodeguard/enforcer/webhookconfig"
)

// kubeconfigCache builds, and keeps, one T (clients) per CAPI Cluster from
// its <name>-kubeconfig Secret in the management cluster; a changed Secret
// builds a new one. The orphan reaper and the denial Events reach workload
// clusters through it.
type kubeconfigCache[T any] struct {
	mgmt  kubernetes.Interface
	build func(*rest.Config) (T, error)

	mu    sync.Mutex
	built map[string]builtFor[T]
}

type builtFor[T any] struct {
	digest [32]byte
	value  T
}

func newKubeconfigCache[T any](mgmt kubernetes.Interface, build func(*rest.Config) (T, error)) *kubeconfigCache[T] {
	return &kubeconfigCache[T]{mgmt: mgmt, build: build, built: map[string]builtFor[T]{}}
}

// get returns the T of cluster ("namespace/name"), reading its Secret.
func (c *kubeconfigCache[T]) get(ctx context.Context, cluster string) (T, error) {
	var zero T
	kc, err := webhookconfig.WorkloadKubeconfig(ctx, c.mgmt, cluster)
	if err != nil {
		return zero, err
	}
	digest := sha256.Sum256(kc)
	c.mu.Lock()
	defer c.mu.Unlock()
	if have, ok := c.built[cluster]; ok && have.digest == digest {
		return have.value, nil
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kc)
	if err != nil {
		return zero, fmt.Errorf("kubeconfig of Cluster %s: %w", cluster, err)
	}
	v, err := c.build(cfg)
	if err != nil {
		return zero, fmt.Errorf("client for Cluster %s: %w", cluster, err)
	}
	c.built[cluster] = builtFor[T]{digest: digest, value: v}
	return v, nil
}
