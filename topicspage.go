// topicspage.go: the event catalog in the panel: the Topics page, where
// the admin registers, edits and deletes topics and an owner reads the
// topics its endpoints may receive, and an endpoint page's test send.

package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// maxTopicForm bounds the Topics page's form: an example and a
// description with room for the form's encoding.
const maxTopicForm = 4*maxTopicExampleLen + 4*maxTopicDescriptionLen

// topicsPage is what the Topics page shows: the catalog (an owner's
// topics, for an owner), and whether the forms that change it are shown.
type topicsPage struct {
	Topics []Topic
	Admin  bool
}

// handleTopicsPage is GET /topics.
func handleTopicsPage(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		topics, err := listTopicsFor(r.Context(), a.db)
		if err != nil {
			return err
		}
		a.panel.render(w, http.StatusOK, "topics", page{Title: "Topics", Nav: "topics", SignedIn: true,
			Flash: flash(r), Data: topicsPage{Topics: topics, Admin: principalOf(r).admin}})
		return nil
	}
}

// handleSaveTopicPage is POST /topics, the Topics page's forms: a new
// topic registered, or with "edit" one changed; then the page again.
func handleSaveTopicPage(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		f := formOf(w, r, maxTopicForm)
		name, description := strings.TrimSpace(f.text("name")), f.text("description")
		example, editing := strings.TrimSpace(f.text("example")), f.text("edit") != ""
		if f.err != nil {
			return f.err
		}
		if !json.Valid([]byte(example)) {
			return fmt.Errorf("%w: example is not valid JSON", errInvalid)
		}
		var err error
		if editing {
			_, err = updateTopic(r.Context(), a.db, name, topicPatch{Description: &description, Example: json.RawMessage(example)})
		} else {
			_, err = createTopic(r.Context(), a.db, topicInput{Name: &name, Description: &description, Example: json.RawMessage(example)})
		}
		if err != nil {
			return err
		}
		http.Redirect(w, r, "/topics?done="+url.QueryEscape(fmt.Sprintf("Topic %s saved.", name)), http.StatusSeeOther)
		return nil
	}
}

// handleDeleteTopicPage is POST /topics/delete, a topic's Delete button.
func handleDeleteTopicPage(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		f := formOf(w, r, maxTopicForm)
		name := f.text("name")
		if f.err != nil {
			return f.err
		}
		if err := deleteTopic(r.Context(), a.db, name); err != nil {
			return err
		}
		http.Redirect(w, r, "/topics?done="+url.QueryEscape(fmt.Sprintf("Topic %s deleted.", name)), http.StatusSeeOther)
		return nil
	}
}

// handleTestEndpointPage is POST /endpoints/{id}/test, the endpoint
// page's test form: one test send, and the page again saying so.
func handleTestEndpointPage(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := pathID(r)
		if err != nil {
			return err
		}
		f := formOf(w, r, maxTopicForm)
		topic := f.text("topic")
		if f.err != nil {
			return f.err
		}
		if topic == "" { // a form without the select: nothing chosen, nothing sent
			http.Redirect(w, r, fmt.Sprintf("/endpoints/%d?done=%s", id, url.QueryEscape("No topic chosen: no test event sent.")), http.StatusSeeOther)
			return nil
		}
		send, err := sendTest(r.Context(), a.db, id, topic, a.maxAttempts)
		if err != nil {
			return err
		}
		done := fmt.Sprintf("Test event %d of %s sent: its attempt shows under Recent attempts.", send.EventID, send.Topic)
		http.Redirect(w, r, fmt.Sprintf("/endpoints/%d?done=%s", id, url.QueryEscape(done)), http.StatusSeeOther)
		return nil
	}
}
