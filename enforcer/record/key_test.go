package record_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/record"
)

func TestAKeyNeedsBothItsParts(t *testing.T) {
	ns, name, err := record.SplitKey("cluster", "fleet/dev")
	require.NoError(t, err)
	assert.Equal(t, "fleet", ns)
	assert.Equal(t, "dev", name)

	for _, key := range []string{"", "dev", "/dev", "fleet/", "a/b/c"} {
		_, _, err := record.SplitKey("--cluster", key)
		assert.EqualError(t, err, `--cluster "`+key+`": want NAMESPACE/NAME`, "key %q", key)
	}
}
