package record

import (
	"fmt"

	"k8s.io/client-go/tools/cache"
)

// SplitKey parses a namespaced object's key, "namespace/name", as what
// (e.g. "cluster", "--service") names it in the error: both parts are
// required. It is nodeguard's one parser of such keys, here beside the
// records those keys name.
func SplitKey(what, key string) (namespace, name string, err error) {
	namespace, name, err = cache.SplitMetaNamespaceKey(key)
	if err != nil || namespace == "" || name == "" {
		return "", "", fmt.Errorf("%s %q: want NAMESPACE/NAME", what, key)
	}
	return namespace, name, nil
}
