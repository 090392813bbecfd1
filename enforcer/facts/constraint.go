// This file reads nodeguard's K8sNodeGuard Constraint from the
// cluster, as Gatekeeper users write it, and follows its edits: the
// parameters and spec.enforcementAction are applied while serving, without a
// restart. A cluster without the Constraint's CRD (no Gatekeeper, or its
// template not applied yet) is looked at again until it has one.

package facts

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/metrics"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// DefaultConstraintName is the Constraint constraints/constraint.yaml applies.
const DefaultConstraintName = "node-deletion-guard"

// ConstraintGroupKind is the Constraint's: Gatekeeper serves a CRD of this kind once
// the K8sNodeGuard ConstraintTemplate is applied.
func ConstraintGroupKind() schema.GroupKind {
	return schema.GroupKind{Group: "constraints.gatekeeper.sh", Kind: ConstraintKind}
}

// ConstraintSpec is what nodeguard takes from the Constraint.
type ConstraintSpec struct {
	// Parameters are spec.parameters (nil: none, the rule's defaults).
	Parameters map[string]any
	// Action is spec.enforcementAction; "" when the Constraint sets none or
	// there is no Constraint.
	Action rule.Action
	// From says where the spec came from, for logs: the Constraint and its
	// resourceVersion, or why there is none.
	From string
}

// Same says whether s and o would decide alike.
func (s ConstraintSpec) Same(o ConstraintSpec) bool {
	return s.Action == o.Action && reflect.DeepEqual(s.Parameters, o.Parameters)
}

// ConstraintSpecOf reads a Constraint. An action nodeguard does not take (e.g.
// Gatekeeper's "scoped") is an error: guessing one would be wrong either way.
func ConstraintSpecOf(obj *unstructured.Unstructured) (ConstraintSpec, error) {
	name := fmt.Sprintf("%s %s", ConstraintKind, obj.GetName())
	params, _, err := unstructured.NestedMap(obj.Object, "spec", "parameters")
	if err != nil {
		return ConstraintSpec{}, fmt.Errorf("%s: spec.parameters: %w", name, err)
	}
	raw, _, err := unstructured.NestedString(obj.Object, "spec", "enforcementAction")
	if err != nil {
		return ConstraintSpec{}, fmt.Errorf("%s: spec.enforcementAction: %w", name, err)
	}
	s := ConstraintSpec{Parameters: params, From: fmt.Sprintf("%s (resourceVersion %s)", name, obj.GetResourceVersion())}
	if raw != "" {
		if s.Action, err = rule.ParseAction(raw); err != nil {
			return ConstraintSpec{}, fmt.Errorf("%s: spec.enforcementAction: %w", name, err)
		}
	}
	return s, nil
}

// ReadConstraint returns the Constraint's spec as the API server has it now. No CRD
// or no Constraint is no error: the Spec is empty and From says which.
func ReadConstraint(ctx context.Context, client dynamic.Interface, mapper meta.RESTMapper, name string) (ConstraintSpec, error) {
	mapping, err := kube.RESTMapping(mapper, ConstraintGroupKind())
	if meta.IsNoMatchError(err) {
		return ConstraintSpec{From: "no " + ConstraintGroupKind().String() + " CRD"}, nil
	}
	if err != nil {
		return ConstraintSpec{}, fmt.Errorf("find the %s resource: %w", ConstraintGroupKind(), err)
	}
	obj, err := client.Resource(mapping.Resource).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ConstraintSpec{From: "no " + ConstraintKind + " " + name}, nil
	}
	if err != nil {
		return ConstraintSpec{}, fmt.Errorf("read %s %s: %w", ConstraintKind, name, err)
	}
	return ConstraintSpecOf(obj)
}

// LiveConstraintParameters are the spec.parameters of the Constraint DefaultConstraintName as the
// API server has it now (none without one, or without Gatekeeper's CRD: the
// rule's defaults): what serve starts with, for the commands that judge live.
func LiveConstraintParameters(ctx context.Context, client dynamic.Interface, mapper meta.RESTMapper) (map[string]any, error) {
	spec, err := ReadConstraint(ctx, client, mapper, DefaultConstraintName)
	if err != nil {
		return nil, fmt.Errorf("%w (or pass --constraint FILE)", err)
	}
	return spec.Parameters, nil
}

// ConstraintWatchOptions configure WatchConstraint.
type ConstraintWatchOptions struct {
	Client dynamic.Interface
	Mapper meta.RESTMapper
	Name   string
	// Applied is the spec already in force (ReadConstraint's, at start); the watch
	// applies only what differs from it.
	Applied ConstraintSpec
	// Apply puts a changed spec in force; an error leaves the spec before it
	// in force (the caller must not half-apply), and is logged and counted.
	Apply func(context.Context, ConstraintSpec) error
	// Recheck is how often a cluster without the CRD is looked at again
	// (default 30s).
	Recheck time.Duration
	Metrics *ConstraintMetrics
	Log     *slog.Logger
}

// WatchConstraint follows the Constraint until ctx is done: each change is applied
// once, a deleted Constraint puts the defaults back in force.
func WatchConstraint(ctx context.Context, opts ConstraintWatchOptions) {
	if opts.Recheck <= 0 {
		opts.Recheck = 30 * time.Second
	}
	var mapping *meta.RESTMapping
	err := wait.PollUntilContextCancel(ctx, opts.Recheck, true, func(context.Context) (bool, error) {
		m, err := kube.RESTMapping(opts.Mapper, ConstraintGroupKind())
		if err != nil {
			return false, nil // not served yet: Gatekeeper or its template comes later
		}
		mapping = m
		return true, nil
	})
	if err != nil {
		return
	}
	// The watch's one goroutine applies the changes, one at a time.
	applied := opts.Applied
	refused := func(err error) {
		opts.Metrics.errors.Inc()
		opts.Log.Error("Constraint refused: the parameters before it stay in force", "from", applied.From, "error", err.Error())
	}
	changed := func(u *unstructured.Unstructured) {
		s := ConstraintSpec{From: ConstraintKind + " " + opts.Name + " deleted"}
		if u != nil {
			if u.GetName() != opts.Name {
				return
			}
			var err error
			if s, err = ConstraintSpecOf(u); err != nil {
				refused(err)
				return
			}
		}
		if s.Same(applied) {
			return
		}
		if err := opts.Apply(ctx, s); err != nil {
			refused(fmt.Errorf("%s: %w", s.From, err))
			return
		}
		applied = s
		opts.Metrics.reloads.Inc()
		opts.Log.Info("Constraint applied", "from", s.From, "enforcementAction", string(s.Action))
	}
	obj, err := kube.WatchObject(kube.ObjectOptions{Client: opts.Client, Resource: mapping.Resource, Name: opts.Name, Changed: changed})
	if err != nil {
		opts.Log.Error("the Constraint is not followed: its edits need a restart", "error", err.Error())
		return
	}
	opts.Log.Info("following the Constraint", "constraint", opts.Name, "resource", mapping.Resource.String())
	obj.Run(ctx)
}

// ConstraintMetrics count the Constraint's reloads.
type ConstraintMetrics struct {
	reloads, errors prometheus.Counter
}

// NewConstraintMetrics registers nodeguard_constraint_reloads_total and
// nodeguard_constraint_reload_errors_total with reg.
func NewConstraintMetrics(reg prometheus.Registerer) (*ConstraintMetrics, error) {
	r := metrics.New(reg)
	m := &ConstraintMetrics{
		reloads: r.Counter("nodeguard_constraint_reloads_total", "Edits of the K8sNodeGuard Constraint put in force while serving."),
		errors: r.Counter("nodeguard_constraint_reload_errors_total",
			"Edits of the K8sNodeGuard Constraint refused (the parameters before them stay in force)."),
	}
	return m, r.Err("the Constraint's metrics")
}
