package main

import (
	"os"
	"regexp"
	"strings"
)

// readBreaking returns the bullets under "### Breaking" in the Unreleased
// section of the changelog at name, each joined into one line.
func readBreaking(name string) ([]string, error) {
	data, err := os.ReadFile(name)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return breakingBullets(string(data)), nil
}

var (
	unreleasedHeading = regexp.MustCompile(`(?i)^##\s+\[?unreleased\]?\s*$`)
	breakingHeading   = regexp.MustCompile(`(?i)^###\s+breaking\b`)
)

func breakingBullets(changelog string) []string {
	var bullets []string
	inUnreleased, inBreaking := false, false
	for _, line := range strings.Split(changelog, "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			inUnreleased, inBreaking = unreleasedHeading.MatchString(strings.TrimSpace(line)), false
			continue
		case strings.HasPrefix(line, "### "):
			inBreaking = inUnreleased && breakingHeading.MatchString(line)
			continue
		case !inBreaking:
			continue
		}
		switch trimmed := strings.TrimSpace(line); {
		case strings.HasPrefix(line, "- ") || strings.HasPrefix(line, "* "):
			bullets = append(bullets, trimmed[2:])
		case trimmed != "" && len(bullets) > 0 && line != trimmed:
			// An indented line goes on with the bullet before it.
			bullets[len(bullets)-1] += " " + trimmed
		}
	}
	return bullets
}

// announced reports whether one of the bullets names ch: its package's
// import path and, but for a removed package, its identifier.
func announced(bullets []string, ch change) bool {
	name := plainName(ch.Name)
	for _, b := range bullets {
		if mentions(b, ch.Pkg, "./-") && (name == "" || mentions(b, name, "")) {
			return true
		}
	}
	return false
}

// plainName writes apidiff's name of an object as a changelog would:
// (*T).M and (T).M as T.M, and without type parameters.
func plainName(name string) string {
	name = strings.NewReplacer("(*", "", "(", "", ")", "").Replace(name)
	for {
		i := strings.Index(name, "[")
		j := strings.Index(name, "]")
		if i < 0 || j < i {
			return name
		}
		name = name[:i] + name[j+1:]
	}
}

// mentions reports whether text has word as a whole word: neither
// preceded nor followed by a letter, digit or underscore, nor preceded by
// a character of more (a path is not mentioned by a longer one that it
// begins or ends).
func mentions(text, word, more string) bool {
	isWord := func(r byte) bool {
		return r == '_' || '0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || r >= 0x80
	}
	for i := 0; ; {
		j := strings.Index(text[i:], word)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(word)
		before := start == 0 || !isWord(text[start-1]) && !strings.ContainsRune(more, rune(text[start-1]))
		after := end == len(text) || !isWord(text[end]) && (text[end] == '.' || !strings.ContainsRune(more, rune(text[end])))
		if before && after {
			return true
		}
		i = start + 1
	}
}
