"""SEE's REST face: the FastAPI inspection app (`app`) and the route parameters its OpenAPI
document declares (`params`); the dashboard's routes and pages are `mutualrl.see.dashboard`."""
