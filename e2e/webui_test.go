package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/tabletflow/tabletflow/workflows"
)

// chromium finds Debian's Chromium (make test installs it: make debs).
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium: install Debian's chromium package (make debs does)")
	return ""
}

// TestWebUIShowsTheStreamAndItsTablets opens the dev server's Web UI in
// headless Chromium, as an operator would: the search-attribute query
// lists the stream's tablet workflows, and the stream's page shows its
// tablets' states in its details. It saves a screenshot (also into
// $TABLETFLOW_SCREENSHOTS, for docs/).
func TestWebUIShowsTheStreamAndItsTablets(t *testing.T) {
	browser := chromium(t)
	e := newEnv(t, "--tablets", "4", "--rate", "100")
	e.startWorker()
	run, _, st := e.streamAll("webui", 4)
	// An operator exclusion shows in the stream's memo too.
	alias := busiest(st)
	e.signal("webui", "exclude", fmt.Sprintf(`{"aliases": [%q], "reason": "web ui check", "ttl": "1h"}`, alias))
	e.waitStatus("webui", "the exclusion in effect", time.Minute, func(st workflows.StreamStatus) (bool, string) {
		if !offReplica(st, alias) {
			return false, summary(st)
		}
		return len(st.Exclude) == 1, summary(st)
	})

	ctx := headlessChromium(t, browser, e.dir)

	// The list, filtered by the stream's search attribute.
	list := temporalUI + "/namespaces/default/workflows?query=" + url.QueryEscape(`TabletflowStream="webui"`)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(list)))
	listText, err := waitForText(ctx, "webui/tablet/t-0004")
	require.NoError(t, err, "the workflow list shows the tablet workflows")
	for _, id := range []string{"webui/tablet/t-0001", "webui/tablet/t-0002", "webui/tablet/t-0003"} {
		require.Contains(t, listText, id)
	}

	// The stream's details: its memo counts its tablets by state.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(temporalUI+"/namespaces/default/workflows/webui/"+run.GetRunID()+"/metadata")))
	page, err := waitForText(ctx, `"Streaming": 4`)
	require.NoError(t, err, "the stream's details show its tablets' states")
	require.Contains(t, page, "tabletStates")
	require.Contains(t, page, `"TabletflowStream": "webui"`, "and its search attribute")
	require.Contains(t, page, alias+" (web ui check) until", "and the operator's exclusions")
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	path := filepath.Join(e.dir, "webui-stream.png")
	require.NoError(t, os.WriteFile(path, shot, 0o644))
	if dir := os.Getenv("TABLETFLOW_SCREENSHOTS"); dir != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "webui-stream.png"), shot, 0o644))
	}
	t.Logf("screenshot: %s", path)
}

// headlessChromium starts Chromium with its profile in dir and returns a
// context for it, ended with the test (or after two minutes).
func headlessChromium(t *testing.T, browser, dir string) context.Context {
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(filepath.Join(dir, "chromium")), chromedp.WindowSize(1600, 1000))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	browserCtx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(browserCtx), "start Chromium")
	ctx, cancel := context.WithTimeout(browserCtx, 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitForText waits until the page's text contains s, and returns it.
func waitForText(ctx context.Context, s string) (string, error) {
	var text string
	for {
		var err error
		text, err = chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		if err == nil && strings.Contains(text, s) {
			return text, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("page never showed %q (%v); it showed: %.600s", s, err, strings.TrimSpace(text))
		case <-time.After(250 * time.Millisecond):
		}
	}
}
