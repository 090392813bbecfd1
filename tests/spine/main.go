// Command spine answers one denied Node DELETE review (after one that warms
// what runs once) for tests/spine/measure.sh, which builds it with coverage
// to list the files and packages of enforcer/ the review runs through: the
// spine (CONTRIBUTING, "The layout").
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"runtime/coverage"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/guard"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()
	e, err := rule.NewEngine(ctx)
	if err != nil {
		return err
	}
	objs, err := facts.LoadManifests("examples/capd-v1beta2")
	if err != nil {
		return err
	}
	infra, pools, err := e.Kinds(nil)
	if err != nil {
		return err
	}
	inv, err := facts.FromObjects(e.Model(), objs, infra, pools)
	if err != nil {
		return err
	}
	g, err := guard.New(ctx, inv, guard.Options{Engine: e})
	if err != nil {
		return err
	}
	var node []byte
	for _, o := range objs {
		if o.GetKind() == "Node" {
			if node, err = json.Marshal(o.Object); err != nil {
				return err
			}
		}
	}
	h := admission.NewWebhook(admission.WebhookOptions{Decider: g,
		Clusters: admission.ClustersFunc(func(context.Context, string) (bool, rule.Action, error) { return true, "", nil })})
	body := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","operation":"DELETE",` +
		`"kind":{"group":"","version":"v1","kind":"Node"},"name":"dev-md-0-x7k2p-abcde","userInfo":{"username":"admin"},"oldObject":` +
		string(node) + `}}`)
	review := func() (*admissionv1.AdmissionResponse, error) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/validate/clusters/default/dev", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, req)
		var out admissionv1.AdmissionReview
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
			return nil, fmt.Errorf("answer %d %s: %v", rec.Code, rec.Body.String(), err)
		}
		return out.Response, nil
	}
	// The first review warms what runs once (the first evaluation's
	// caches); the spine is what the second runs.
	if _, err := review(); err != nil {
		return err
	}
	if err := coverage.ClearCounters(); err != nil {
		return fmt.Errorf("build it with -cover -covermode=atomic (tests/spine/measure.sh): %w", err)
	}
	answer, err := review()
	if err != nil {
		return err
	}
	if answer.Allowed {
		return fmt.Errorf("the example's Node was allowed; it is blocked")
	}
	return nil
}
