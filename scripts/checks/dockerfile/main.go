// Command dockerfile checks the Dockerfile and .dockerignore of the repository at ROOT with
// BuildKit's own Dockerfile frontend, without a Docker engine or a registry:
//
//   - the Dockerfile parses, and every stage (all at once, then each as the build target) converts
//     to a build graph (LLB) with the linter on and no lint warnings;
//   - every base image carries an explicit tag (the image resolver refuses `:latest`, which also
//     catches a mistyped `COPY --from=stage` or `FROM stage`);
//   - .dockerignore keeps what the build needs in the build context (the workspace manifests,
//     every member's Cargo.toml and src/, scripts/fetch-model.sh) and keeps out target/, .git,
//     models/, .env, compose.yaml and nats/.
//
// Usage: go run . ROOT   Prints "ok MSG" or "fail MSG" per check; exits 1 if anything failed.
package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/buildkit/client/llb/sourceresolver"
	"github.com/moby/buildkit/frontend/dockerfile/dockerfile2llb"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerui"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	digest "github.com/opencontainers/go-digest"
	"github.com/pelletier/go-toml"
)

// Paths that must be (+) or must not be (-) in the build context; main adds +MEMBER/Cargo.toml
// and +MEMBER/src for every workspace member.
var contextSpecs = []string{
	"+Cargo.toml", "+Cargo.lock", "+scripts/fetch-model.sh",
	"-.git", "-target", "-models", "-.env", "-compose.yaml", "-nats",
}

var failed bool

func ok(format string, args ...any) { fmt.Printf("ok "+format+"\n", args...) }

func fail(format string, args ...any) {
	fmt.Printf("fail "+format+"\n", args...)
	failed = true
}

// resolver answers image lookups without a registry and refuses unpinned images.
type resolver struct{}

func (resolver) ResolveImageConfig(ctx context.Context, ref string, opt sourceresolver.Opt) (string, digest.Digest, []byte, error) {
	if strings.HasSuffix(ref, ":latest") {
		return "", "", nil, fmt.Errorf("image %q: base images must carry an explicit tag (or is this a mistyped stage name?)", ref)
	}
	cfg := []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},"config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}}`)
	return ref, digest.FromBytes(cfg), cfg, nil
}

// stageNames lists the named stages of the Dockerfile, in order.
func stageNames(dt []byte) ([]string, error) {
	res, err := parser.Parse(bytes.NewReader(dt))
	if err != nil {
		return nil, err
	}
	stages, _, err := instructions.Parse(res.AST, nil)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range stages {
		if s.Name != "" {
			names = append(names, s.Name)
		}
	}
	return names, nil
}

// convertsCleanly converts the Dockerfile for one target ("" = all stages) with the linter on.
func convertsCleanly(dt []byte, target string) {
	name := target
	if name == "" {
		name = "all stages"
	}
	var warnings []string
	st, _, _, _, err := dockerfile2llb.Dockerfile2LLB(context.Background(), dt, dockerfile2llb.ConvertOpt{
		Config:       dockerui.Config{Target: target},
		MetaResolver: resolver{},
		AllStages:    target == "",
		Warn: func(rule, description, url, msg string, location []parser.Range) {
			line := 0
			if len(location) > 0 {
				line = location[0].Start.Line
			}
			warnings = append(warnings, fmt.Sprintf("%s (line %d): %s", rule, line, msg))
		},
	})
	if err != nil {
		fail("Dockerfile [%s]: %v", name, err)
		return
	}
	def, err := st.Marshal(context.Background())
	if err != nil {
		fail("Dockerfile [%s]: %v", name, err)
		return
	}
	for _, w := range warnings {
		fail("Dockerfile [%s]: lint %s", name, w)
	}
	if len(warnings) == 0 {
		ok("Dockerfile [%s]: converts to a build graph of %d operations, no lint warnings", name, len(def.Def))
	}
}

// checkDockerfile converts all stages together and then each named stage as the target.
func checkDockerfile(root string) {
	dt, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		fail("%v", err)
		return
	}
	names, err := stageNames(dt)
	if err != nil {
		fail("Dockerfile: %v", err)
		return
	}
	for _, target := range append([]string{""}, names...) {
		convertsCleanly(dt, target)
	}
}

// workspaceMembers reads [workspace] members from ROOT/Cargo.toml.
func workspaceMembers(root string) ([]string, error) {
	tree, err := toml.LoadFile(filepath.Join(root, "Cargo.toml"))
	if err != nil {
		return nil, err
	}
	list, _ := tree.Get("workspace.members").([]any)
	var members []string
	for _, m := range list {
		if s, isString := m.(string); isString {
			members = append(members, s)
		}
	}
	if len(members) == 0 {
		return nil, fmt.Errorf("Cargo.toml: no [workspace] members")
	}
	return members, nil
}

// buildContext applies ROOT/.dockerignore to the tree: the files sent to the builder, and their size.
func buildContext(root string) (map[string]bool, int64, error) {
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		return nil, 0, fmt.Errorf(".dockerignore: %w", err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return nil, 0, fmt.Errorf(".dockerignore: %w", err)
	}
	included := map[string]bool{}
	var size int64
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		excluded, err := pm.MatchesOrParentMatches(rel)
		if err != nil {
			return err
		}
		if excluded {
			if d.IsDir() && !pm.Exclusions() {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.IsDir() {
			included[rel] = true
			if info, err := d.Info(); err == nil {
				size += info.Size()
			}
		}
		return nil
	})
	return included, size, err
}

// checkDockerignore: +path must be in the build context, -path must not.
func checkDockerignore(root string) {
	members, err := workspaceMembers(root)
	if err != nil {
		fail("%v", err)
		return
	}
	specs := contextSpecs
	for _, m := range members {
		specs = append(specs, "+"+m+"/Cargo.toml", "+"+m+"/src")
	}
	included, size, err := buildContext(root)
	if err != nil {
		fail("%v", err)
		return
	}
	has := func(path string) bool {
		for f := range included {
			if f == path || strings.HasPrefix(f, path+"/") {
				return true
			}
		}
		return false
	}
	good := true
	for _, spec := range specs {
		path := spec[1:]
		switch {
		case spec[0] == '+' && !has(path):
			fail(".dockerignore: %s is not in the build context", path)
			good = false
		case spec[0] == '-' && has(path):
			fail(".dockerignore: %s is in the build context", path)
			good = false
		}
	}
	if good {
		ok(".dockerignore: build context of %d files, %.1f MiB, holds what the build needs (%d workspace members) and none of the excluded paths",
			len(included), float64(size)/(1<<20), len(members))
	}
}

func main() {
	if len(os.Args) != 2 {
		fmt.Println("fail usage: dockerfile ROOT")
		os.Exit(2)
	}
	checkDockerfile(os.Args[1])
	checkDockerignore(os.Args[1])
	if failed {
		os.Exit(1)
	}
}
