// hclfmt checks that Terraform files are in canonical layout, offline: it runs hclwrite.Format, the
// formatter `terraform fmt` is built on, over every .tf file under the given directories. With -check it
// lists the files that would change and exits 3 (as `terraform fmt -check` does); without, it rewrites them.
// (terraform fmt additionally unwraps interpolation-only strings and legacy quoted type names; this does not.)
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclwrite"
)

func main() {
	check := flag.Bool("check", false, "only list files that are not formatted; exit 3 if any")
	flag.Parse()
	roots := flag.Args()
	if len(roots) == 0 {
		roots = []string{"."}
	}
	unformatted, failed := 0, false
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == ".terraform" || strings.HasPrefix(d.Name(), ".") && path != root) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".tf") {
				return nil
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if _, diags := hclwrite.ParseConfig(src, path, hcl.InitialPos); diags.HasErrors() {
				fmt.Fprintln(os.Stderr, diags.Error())
				failed = true
				return nil
			}
			out := hclwrite.Format(src)
			if bytes.Equal(src, out) {
				return nil
			}
			unformatted++
			fmt.Println(path)
			if !*check {
				return os.WriteFile(path, out, 0o644)
			}
			return nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	switch {
	case failed:
		os.Exit(2)
	case *check && unformatted > 0:
		os.Exit(3)
	}
}
