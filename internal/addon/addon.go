// Package addon renders nodeguard as a clusterctl add-on provider: the
// release artifacts clusterctl reads, addon-components.yaml (the kustomize
// deployment of clusterctl/, with the ${VARIABLES} clusterctl
// substitutes) and metadata.yaml (a release series per minor version of the
// version ledger). Both come from what the other install paths are built
// from, so the three cannot drift apart unnoticed.
package addon

import (
	"fmt"
	"path/filepath"
	"regexp"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/internal/policydoc"
)

const (
	// Label is the provider label clusterctl gives an add-on provider named
	// nodeguard ("addon-" and its name), on every object of its components.
	Label = "addon-nodeguard"
	// ComponentsFile and MetadataFile are the release artifacts' names.
	ComponentsFile = "addon-components.yaml"
	MetadataFile   = "metadata.yaml"
	// Contract is the Cluster API contract every release series declares.
	Contract = "v1beta2"
	// Overlay is the kustomization the components are rendered from.
	Overlay = "clusterctl"
)

// Components renders addon-components.yaml from the repository at root and
// checks what clusterctl requires of it: exactly one Namespace, every
// namespaced object in it, every object labelled as the provider.
func Components(root string) ([]byte, error) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(root, Overlay))
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", Overlay, err)
	}
	var namespaces []string
	for _, r := range m.Resources() {
		if r.GetKind() == "Namespace" {
			namespaces = append(namespaces, r.GetName())
		}
	}
	if len(namespaces) != 1 {
		return nil, fmt.Errorf("%s renders %d Namespaces %v: clusterctl wants exactly one", Overlay, len(namespaces), namespaces)
	}
	for _, r := range m.Resources() {
		if got := r.GetLabels()["cluster.x-k8s.io/provider"]; got != Label {
			return nil, fmt.Errorf("%s %s: label cluster.x-k8s.io/provider is %q, want %q", r.GetKind(), r.GetName(), got, Label)
		}
		if ns := r.GetNamespace(); ns != "" && ns != namespaces[0] {
			return nil, fmt.Errorf("%s %s is in namespace %s, not in the components' %s", r.GetKind(), r.GetName(), ns, namespaces[0])
		}
	}
	out, err := m.AsYaml()
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", Overlay, err)
	}
	return out, nil
}

// metadata is clusterctl's Metadata (clusterctl.cluster.x-k8s.io/v1alpha3),
// the fields a provider's metadata.yaml sets.
type metadata struct {
	APIVersion    string          `json:"apiVersion"`
	Kind          string          `json:"kind"`
	ReleaseSeries []releaseSeries `json:"releaseSeries"`
}

type releaseSeries struct {
	Major    int    `json:"major"`
	Minor    int    `json:"minor"`
	Contract string `json:"contract"`
}

// Metadata renders metadata.yaml: one release series per major.minor of
// the ledger's versions, newest first, each on the v1beta2 contract.
func Metadata(ledger policydoc.Ledger) ([]byte, error) {
	md := metadata{APIVersion: "clusterctl.cluster.x-k8s.io/v1alpha3", Kind: "Metadata"}
	seen := map[[2]int]bool{}
	for i := len(ledger) - 1; i >= 0; i-- {
		var major, minor, patch int
		if _, err := fmt.Sscanf(ledger[i].Version, "%d.%d.%d", &major, &minor, &patch); err != nil {
			return nil, fmt.Errorf("version %q of the ledger: want MAJOR.MINOR.PATCH", ledger[i].Version)
		}
		if seen[[2]int{major, minor}] {
			continue
		}
		seen[[2]int{major, minor}] = true
		md.ReleaseSeries = append(md.ReleaseSeries, releaseSeries{Major: major, Minor: minor, Contract: Contract})
	}
	out, err := yaml.Marshal(md)
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", MetadataFile, err)
	}
	header := "# clusterctl's metadata of the nodeguard add-on provider, generated from versions.yaml\n" +
		"# by `make generate`: each minor release series and the Cluster API contract it serves.\n"
	return append([]byte(header), out...), nil
}

var variable = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:=([^}]*))?\}`)

// Variables lists the ${VARIABLES} of components, each once, in order, with
// its default. An empty default is none (HasDefault false): clusterctl
// requires a value for it as for a variable without one.
func Variables(components []byte) []Variable {
	var out []Variable
	seen := map[string]bool{}
	for _, m := range variable.FindAllSubmatch(components, -1) {
		name := string(m[1])
		if seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, Variable{Name: name, Default: string(m[3]), HasDefault: len(m[3]) > 0})
	}
	return out
}

// Variable is one of the components' ${VARIABLES}.
type Variable struct {
	Name       string
	Default    string
	HasDefault bool
}
