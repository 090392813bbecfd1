package clusters

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// KubeconfigSecret is the Secret where CAPI keeps the kubeconfig of the
// workload Cluster key ("namespace/name"), in the Cluster's namespace: the
// Cluster's name with -kubeconfig, so its key is the Cluster's with it.
func KubeconfigSecret(key string) string { return key + kubeconfigSuffix }

const kubeconfigSuffix = "-kubeconfig"

// ReadKubeconfig reads the kubeconfig CAPI keeps for the workload Cluster key
// ("namespace/name"): Secret <name>-kubeconfig, key "value", in the
// Cluster's namespace. A missing Secret is an error apierrors.IsNotFound
// recognizes.
func ReadKubeconfig(ctx context.Context, secrets kubernetes.Interface, key string) ([]byte, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil || ns == "" || name == "" {
		return nil, fmt.Errorf("cluster %q: want NAMESPACE/NAME", key)
	}
	secret, err := secrets.CoreV1().Secrets(ns).Get(ctx, name+kubeconfigSuffix, metav1.GetOptions{})
	if err != nil {
		return nil, &readError{key: key, err: err}
	}
	value := secret.Data["value"]
	if len(value) == 0 {
		return nil, fmt.Errorf("Secret %s has no key \"value\"", KubeconfigSecret(key))
	}
	return value, nil
}

// readError is a failed read of a kubeconfig Secret.
type readError struct {
	key string
	err error
}

func (e *readError) Error() string {
	return fmt.Sprintf("read the kubeconfig of Cluster %s: %v", e.key, e.err)
}
func (e *readError) Unwrap() error { return e.err }

// Cache builds, and keeps, one T (clients) per workload Cluster from its
// kubeconfig Secret, read at each Get; a changed kubeconfig builds a new T.
// Set's sessions and the denial Events' workload clients reach workload
// clusters through it. Safe for concurrent use.
type Cache[T any] struct {
	secrets kubernetes.Interface
	build   func(key string, cfg *rest.Config) (T, error)

	mu    sync.Mutex
	built map[string]builtFor[T]
}

type builtFor[T any] struct {
	digest [sha256.Size]byte
	value  T
}

// NewCache reads Secrets through secrets (GET only) and builds with build.
func NewCache[T any](secrets kubernetes.Interface, build func(key string, cfg *rest.Config) (T, error)) *Cache[T] {
	return &Cache[T]{secrets: secrets, build: build, built: map[string]builtFor[T]{}}
}

// Get returns the T of the Cluster key, built from its kubeconfig as it is
// now.
func (c *Cache[T]) Get(ctx context.Context, key string) (T, error) {
	v, _, err := c.get(ctx, key)
	return v, err
}

// get is Get, also saying whether the error is the API server's failing to
// answer (the Secret may well be there) rather than a kubeconfig that is
// missing or does not build.
func (c *Cache[T]) get(ctx context.Context, key string) (v T, unanswered bool, err error) {
	kubeconfig, err := ReadKubeconfig(ctx, c.secrets, key)
	if err != nil {
		var read *readError
		return v, errors.As(err, &read) && !apierrors.IsNotFound(err), err
	}
	digest := sha256.Sum256(kubeconfig)
	c.mu.Lock()
	defer c.mu.Unlock()
	if have, ok := c.built[key]; ok && have.digest == digest {
		return have.value, false, nil
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return v, false, fmt.Errorf("kubeconfig of Cluster %s: %w", key, err)
	}
	if v, err = c.build(key, cfg); err != nil {
		return v, false, fmt.Errorf("clients of Cluster %s: %w", key, err)
	}
	c.built[key] = builtFor[T]{digest: digest, value: v}
	return v, false, nil
}

// Forget drops what was built for a Cluster that is gone.
func (c *Cache[T]) Forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.built, key)
}
