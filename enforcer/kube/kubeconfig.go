package kube

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeguard/nodeguard/enforcer/record"
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
	ns, name, err := record.SplitKey("cluster", key)
	if err != nil {
		return nil, err
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

// unanswered says whether err is the management API server's failing to
// answer a read of the Secret (it may well be there), rather than a
// kubeconfig that is missing or does not build.
func unanswered(err error) bool {
	var read *readError
	return errors.As(err, &read) && !apierrors.IsNotFound(err)
}

// ClusterConfig is the REST config of a workload Cluster's kubeconfig: the one way
// from a kubeconfig to a client, for the Set's connections and the commands
// that reach a workload cluster once.
func ClusterConfig(key string, kubeconfig []byte) (*rest.Config, error) {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig of Cluster %s (Secret %s): %w", key, KubeconfigSecret(key), err)
	}
	return cfg, nil
}

// ConnectCluster reads the kubeconfig of the workload Cluster key through secrets
// and returns its REST config.
func ConnectCluster(ctx context.Context, secrets kubernetes.Interface, key string) (*rest.Config, error) {
	kubeconfig, err := ReadKubeconfig(ctx, secrets, key)
	if err != nil {
		return nil, err
	}
	return ClusterConfig(key, kubeconfig)
}
