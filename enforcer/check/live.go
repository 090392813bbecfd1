package check

import (
	"context"
	"fmt"

	"github.com/nodeguard/nodeguard/enforcer/decision"
)

func live(_ context.Context, _ Options, _ map[string]any) (decision.Decision, error) {
	return decision.Decision{}, fmt.Errorf("live mode (without -f) is not built yet; pass -f")
}
