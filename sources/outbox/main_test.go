package outbox

import (
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
