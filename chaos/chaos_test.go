package chaos

import (
	"os"
	"testing"
	"time"
)

func TestMain(m *testing.M) { Main(m) }

// TestChaos injects every fault into every pairing of the plan and fails
// on any lost event, any order violation where the source promises order,
// any rolled-back event delivered, duplicates beyond the bound, a pipeline
// that does not recover, or a process that does not stop cleanly.
//
// By default it runs the bounded CI plan; FERRY_CHAOS=full runs the full
// matrix (`make chaos`), FERRY_CHAOS=matrix the CI counts on every pairing,
// FERRY_CHAOS_SCENARIO=source,sink,fault,count[,outage] one scenario alone
// (fault "mixed" for count mixed faults), to reproduce a failure; and
// FERRY_CHAOS_REPORT=FILE writes the table.
func TestChaos(t *testing.T) {
	plan := CIPlan()
	switch os.Getenv("FERRY_CHAOS") {
	case "full":
		plan = FullPlan()
	case "matrix":
		plan = MatrixPlan()
	}
	if spec := os.Getenv("FERRY_CHAOS_SCENARIO"); spec != "" {
		var err error
		if plan, err = SingleScenarioPlan(spec); err != nil {
			t.Fatal(err)
		}
	}
	began := time.Now()
	var results []Result
	for _, c := range plan.Combos {
		for _, sc := range plan.ScenariosFor(c, 1) {
			t.Run(c.String()+"/"+sc.Name, func(t *testing.T) {
				res := Run(t, plan.Config(c, sc), sc)
				results = append(results, res)
				t.Log(res.Summary())
				if plan.Name == "single" {
					t.Logf("faults %v, recoveries %v\nnotes %v", sc.Faults, res.Recovery, res.Notes)
				}
				if !res.Passed() {
					t.Errorf("%s × %s, %s:\n  %s\nFerry's log (tail):\n%s", c.Source, c.Sink, sc.Name, joinLines(res.Failures), res.Log)
				}
			})
		}
	}
	if path := os.Getenv("FERRY_CHAOS_REPORT"); path != "" {
		if err := WriteReport(path, plan, results, time.Since(began)); err != nil {
			t.Fatal(err)
		}
	}
}
