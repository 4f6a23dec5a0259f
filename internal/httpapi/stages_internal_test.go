package httpapi

import (
	"slices"
	"testing"

	"github.com/ferryhq/ferry/pipelines"
)

// A pipeline's stages are named as its metrics name them, from a file's
// spec or a store pipeline's text alike: a canary written among the
// transforms is no stage, and keeps the others' indexes.
func TestStageNames(t *testing.T) {
	want := []string{"read", "1:headers", "2:filter", "publish"}
	spec := &pipelines.Spec{Transforms: []pipelines.Component{{Type: "headers", Path: "transforms[1]"}, {Type: "filter", Path: "transforms[2]"}}}
	if got := stageNames(spec, ""); !slices.Equal(got, want) {
		t.Errorf("from a spec: %v, want %v", got, want)
	}
	text := "name: p\ntransforms:\n  - {type: canary, topic: t}\n  - {type: headers}\n  - {type: filter}\n"
	if got := stageNames(nil, text); !slices.Equal(got, want) {
		t.Errorf("from a text: %v, want %v", got, want)
	}
	if got := stageNames(nil, "name: p\n"); !slices.Equal(got, []string{"read", "publish"}) {
		t.Errorf("without transforms: %v", got)
	}
}
