package outbox

import (
	"testing"

	"github.com/ferryhq/ferry/lab/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
