// This file implements `nodeguard cleanup`, the chart's pre-delete
// hook: it removes what nodeguard itself wrote outside the chart, so an
// uninstall leaves no webhook configuration pointing at nothing (with
// failurePolicy Fail, one would deny every Node delete there, Cluster API's
// included). The fleet restores what it keeps, so it stops nodeguard first.

package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/fleet"
	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// CleanupOptions are the flags of `nodeguard cleanup`.
type CleanupOptions struct {
	Kubeconfig, Context string
	// Namespace is nodeguard's: its Deployment and the fleet's status.
	Namespace string
	// Deployment, when set, is scaled to 0 first, and back when something
	// could not be removed (nodeguard then keeps guarding).
	Deployment string
	// Timeout bounds the wait for its Pods to go.
	Timeout time.Duration
	// WatchFilter is the install's (serve --watch-filter): only its
	// Clusters are cleaned, and Gatekeeper's Provider, which a shard never
	// writes, is left alone.
	WatchFilter string
}

// Cleanup cleans up and prints what it removed; the int is the exit code: 1 when
// something could not be removed (said which, and the Deployment scaled
// back), else 0.
func Cleanup(ctx context.Context, opts CleanupOptions, out io.Writer) (int, error) {
	if opts.Namespace == "" {
		return 1, fmt.Errorf("--namespace is required")
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Minute
	}
	c, err := kube.Connect(opts.Kubeconfig, opts.Context)
	if err != nil {
		return 1, err
	}
	kube, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return 1, fmt.Errorf("create client: %w", err)
	}
	return run(ctx, c, kube, opts, out)
}

func run(ctx context.Context, c kube.Clients, kube kubernetes.Interface, opts CleanupOptions, out io.Writer) (int, error) {
	var replicas int32
	var err error
	if opts.Deployment != "" {
		if replicas, err = stop(ctx, kube, opts, out); err != nil {
			return 1, err
		}
	}
	errs := remove(ctx, c, opts.WatchFilter, out)
	if errs == nil {
		fmt.Fprintln(out, "cleanup: done")
		return 0, nil
	}
	fmt.Fprintf(out, "cleanup: not everything could be removed:\n%v\n", errs)
	if opts.Deployment != "" {
		if err := scale(ctx, kube, opts, replicas); err != nil {
			return 1, fmt.Errorf("%w; and Deployment %s/%s could not be scaled back to %d: %v", errs, opts.Namespace, opts.Deployment, replicas, err)
		}
		fmt.Fprintf(out, "cleanup: Deployment %s/%s scaled back to %d: nodeguard guards as before\n", opts.Namespace, opts.Deployment, replicas)
	}
	return 1, nil
}

// stop scales the Deployment to 0 and waits for its Pods to go; it returns
// the replicas it had.
func stop(ctx context.Context, kube kubernetes.Interface, opts CleanupOptions, out io.Writer) (int32, error) {
	deployments := kube.AppsV1().Deployments(opts.Namespace)
	d, err := deployments.Get(ctx, opts.Deployment, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("get Deployment %s/%s: %w", opts.Namespace, opts.Deployment, err)
	}
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	if err := scale(ctx, kube, opts, 0); err != nil {
		return 0, err
	}
	selector, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return replicas, fmt.Errorf("Deployment %s/%s selector: %w", opts.Namespace, opts.Deployment, err)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, opts.Timeout, true, func(ctx context.Context) (bool, error) {
		pods, err := kube.CoreV1().Pods(opts.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector.String()})
		if err != nil {
			return false, nil //nolint:nilerr // a failed list is tried again until the timeout
		}
		return len(pods.Items) == 0, nil
	})
	if err != nil {
		if serr := scale(ctx, kube, opts, replicas); serr != nil {
			err = fmt.Errorf("%w; and scaling back failed: %v", err, serr)
		}
		return replicas, fmt.Errorf("wait for the Pods of Deployment %s/%s to go: %w", opts.Namespace, opts.Deployment, err)
	}
	fmt.Fprintf(out, "cleanup: Deployment %s/%s scaled from %d to 0; its Pods are gone\n", opts.Namespace, opts.Deployment, replicas)
	return replicas, nil
}

func scale(ctx context.Context, kube kubernetes.Interface, opts CleanupOptions, replicas int32) error {
	_, err := kube.AppsV1().Deployments(opts.Namespace).UpdateScale(ctx, opts.Deployment, &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Namespace: opts.Namespace, Name: opts.Deployment},
		Spec:       autoscalingv1.ScaleSpec{Replicas: replicas},
	}, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("scale Deployment %s/%s to %d: %w", opts.Namespace, opts.Deployment, replicas, err)
	}
	return nil
}

// remove deletes what nodeguard owns: Gatekeeper's Provider here, and what
// the fleet installed in each workload cluster. The fleet's ClusterGuards go
// with their CustomResourceDefinition, which the uninstall deletes.
func remove(ctx context.Context, c kube.Clients, watchFilter string, out io.Writer) error {
	var errs []error
	selector := ""
	here := []struct {
		what            string
		gvr             schema.GroupVersionResource
		namespace, name string
	}{
		{"Gatekeeper Provider nodeguard", admission.ProviderGVR, "", "nodeguard"},
	}
	if watchFilter != "" {
		here, selector = nil, kube.WatchFilterLabel+"="+watchFilter
	}
	for _, h := range here {
		deleted, err := kube.DeleteOwned(ctx, c.Dynamic, h.gvr, h.namespace, h.name)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", h.what, err))
		} else if deleted {
			fmt.Fprintf(out, "cleanup: removed %s\n", h.what)
		}
	}
	keys, err := kube.ClusterKeys(ctx, c, "", selector)
	if meta.IsNoMatchError(err) || meta.IsNoMatchError(errors.Unwrap(err)) {
		return errors.Join(errs...) // no Cluster API here: no workload cluster to clean
	}
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, key := range keys {
		dyn, err := kube.ClusterDynamic(ctx, c.Config, key)
		if err != nil {
			// No kubeconfig, no fleet there either: nothing it could have installed.
			fmt.Fprintf(out, "cleanup: Cluster %s skipped: %v\n", key, err)
			continue
		}
		removed, err := fleet.Uninstall(ctx, dyn)
		for _, r := range removed {
			fmt.Fprintf(out, "cleanup: Cluster %s: removed %s\n", key, r)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("Cluster %s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}
