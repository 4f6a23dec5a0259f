package httpapi

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/store"
)

// stageNames lists a pipeline's stages as its metrics name them (read,
// "<index>:<type>" per transform, publish), from its definition: a file
// pipeline's spec or a store pipeline's text. A canary written in the
// transforms list is no stage of its own.
func stageNames(spec *pipelines.Spec, config string) []string {
	names := []string{engine.StageRead}
	if spec != nil {
		for i, t := range spec.Transforms {
			n := i
			if _, err := fmt.Sscanf(t.Path, "transforms[%d]", &n); err != nil {
				n = i
			}
			names = append(names, fmt.Sprintf("%d:%s", n, t.Type))
		}
		return append(names, engine.StagePublish)
	}
	var doc struct {
		Transforms []struct {
			Type string `yaml:"type"`
		} `yaml:"transforms"`
	}
	_ = yaml.Unmarshal([]byte(config), &doc)
	for i, t := range doc.Transforms {
		if t.Type != pipelines.CanaryType {
			names = append(names, fmt.Sprintf("%d:%s", i, t.Type))
		}
	}
	return append(names, engine.StagePublish)
}

// stagesOf is stageNames for one view, from the converger's snapshot.
func stagesOf(snap store.Snapshot, v PipelineView) []string {
	if spec := snap.Files[v.Name]; spec != nil {
		return stageNames(spec, "")
	}
	for _, p := range snap.Pipelines {
		if p.Name == v.Name {
			return stageNames(nil, p.Config)
		}
	}
	return []string{engine.StageRead, engine.StagePublish}
}
